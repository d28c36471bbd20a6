#include "dsv4/model/session_io.h"

#include <bit>
#include <type_traits>

#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

static_assert(std::endian::native == std::endian::little, "session bytes are little-endian");

template <typename T>
constexpr bool is_number_vector = false;
template <typename T>
constexpr bool is_number_vector<std::vector<T>> = std::is_arithmetic_v<T>;

struct Writer {
  ByteSink& out;
  template <typename T>
  void operator()(const T& field) {
    if constexpr (std::is_arithmetic_v<T>) {
      out.write(&field, sizeof field);
    } else if constexpr (is_number_vector<T>) {
      const uint64_t n = field.size();
      out.write(&n, sizeof n);
      if (n) out.write(field.data(), n * sizeof(typename T::value_type));
    } else {
      static_assert(std::is_same_v<T, std::vector<LayerState>>);
      const uint64_t n = field.size();
      out.write(&n, sizeof n);
      for (const LayerState& l : field) visit_fields(l, *this);
    }
  }
};

struct Reader {
  ByteSource& in;
  uint64_t count(size_t min_element_bytes) {
    uint64_t n = 0;
    in.read(&n, sizeof n);
    if (n > in.remaining() / min_element_bytes) fail("session bytes: a count of {} does not fit the {} bytes left", n, in.remaining());
    return n;
  }
  template <typename T>
  void operator()(T& field) {
    if constexpr (std::is_same_v<T, bool>) {
      uint8_t b = 0;
      in.read(&b, 1);
      if (b > 1) fail("session bytes: a flag is {}, not 0 or 1", b);
      field = b == 1;
    } else if constexpr (std::is_arithmetic_v<T>) {
      in.read(&field, sizeof field);
    } else if constexpr (is_number_vector<T>) {
      using E = typename T::value_type;
      field.resize(count(sizeof(E)));
      if (!field.empty()) in.read(field.data(), field.size() * sizeof(E));
    } else {
      static_assert(std::is_same_v<T, std::vector<LayerState>>);
      field.resize(count(8));  // a layer holds at least one count
      for (LayerState& l : field) visit_fields(l, *this);
    }
  }
};

struct Counter {
  uint64_t bytes = 0;
  template <typename T>
  void operator()(const T& field) {
    if constexpr (std::is_arithmetic_v<T>) {
      bytes += sizeof field;
    } else if constexpr (is_number_vector<T>) {
      bytes += field.size() * sizeof(typename T::value_type) + 8;
    } else {
      bytes += 8;
      for (const LayerState& l : field) visit_fields(l, *this);
    }
  }
};

}  // namespace

void write_session(const SessionState& s, ByteSink& out) {
  Writer w{out};
  visit_fields(s, w);
}

SessionState read_session(ByteSource& in) {
  SessionState s;
  Reader r{in};
  visit_fields(s, r);
  return s;
}

uint64_t serialized_session_bytes(const SessionState& s) {
  Counter c;
  visit_fields(s, c);
  return c.bytes;
}

}  // namespace dsv4
