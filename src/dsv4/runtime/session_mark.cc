#include "dsv4/runtime/session_mark.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

// The fields later tokens only append to (the token list, each compressor's entries): the mark
// keeps their sizes, and a rewind cuts them back. `layer`: the layer being walked, if any.
bool appends_only(const void* field, const SessionState& s, const LayerState* layer) {
  return field == &s.tokens || (layer && (field == &layer->compressor.entries || field == &layer->indexer.entries));
}

// Writes the mark's bytes; with `out` null it only counts them.
struct Marker {
  const SessionState& s;
  std::byte* out = nullptr;
  size_t size = 0;
  const LayerState* layer = nullptr;

  void put(const void* p, size_t n) {
    if (out && n) std::memcpy(out + size, p, n);
    size += n;
  }
  template <typename T>
  void operator()(const T& field) {
    if constexpr (std::is_arithmetic_v<T>) {
      put(&field, sizeof field);
    } else if constexpr (std::is_same_v<T, std::vector<LayerState>>) {
      const uint64_t n = field.size();
      put(&n, sizeof n);
      for (const LayerState& l : field) {
        layer = &l;
        visit_fields(l, *this);
      }
      layer = nullptr;
    } else {
      const uint64_t n = field.size();
      put(&n, sizeof n);
      if (!appends_only(&field, s, layer)) put(field.data(), n * sizeof(typename T::value_type));
    }
  }
};

// Reads the mark's bytes back into `s`; with `check` it only checks that `s` continues the
// marked state (same layers, no fewer tokens or entries, no earlier position) and writes nothing.
struct Restorer {
  SessionState& s;
  const std::byte* in;
  bool check;
  const LayerState* layer = nullptr;

  void get(void* p, size_t n) {
    if (!check && n) std::memcpy(p, in, n);
    in += n;
  }
  uint64_t count() {
    uint64_t n = 0;
    std::memcpy(&n, in, sizeof n);
    in += sizeof n;
    return n;
  }
  template <typename T>
  void operator()(T& field) {
    if constexpr (std::is_arithmetic_v<T>) {
      if (check && static_cast<const void*>(&field) == &s.position) {
        int64_t marked = 0;
        std::memcpy(&marked, in, sizeof marked);
        if (s.position < marked) fail("rewind_session: the session is not a continuation of its mark");
      }
      get(&field, sizeof field);
    } else if constexpr (std::is_same_v<T, std::vector<LayerState>>) {
      if (count() != field.size()) fail("rewind_session: the session is not a continuation of its mark");
      for (LayerState& l : field) {
        layer = &l;
        visit_fields(l, *this);
      }
      layer = nullptr;
    } else {
      using E = typename T::value_type;
      const uint64_t n = count();
      if (appends_only(&field, s, layer)) {
        if (field.size() < n) fail("rewind_session: the session holds fewer tokens or compressor entries than its mark");
        if (!check) field.resize(n);
      } else {
        if (!check) field.resize(n);
        get(field.data(), n * sizeof(E));
      }
    }
  }
};

}  // namespace

SessionMark mark_session(const SessionState& s) {
  Marker counter{s};
  visit_fields(s, counter);
  SessionMark m;
  m.fields.resize(counter.size);
  Marker writer{s, m.fields.data()};
  visit_fields(s, writer);
  return m;
}

void rewind_session(SessionState& s, const SessionMark& m) {
  // Checked in full first, so a session that does not continue the mark is left untouched.
  Restorer checker{s, m.fields.data(), true};
  visit_fields(s, checker);
  Restorer restorer{s, m.fields.data(), false};
  visit_fields(s, restorer);
}

}  // namespace dsv4
