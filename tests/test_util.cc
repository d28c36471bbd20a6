#include "test_util.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "dsv4/io/checkpoint.h"
#include "dsv4/platform/platform.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <variant>

namespace dsv4::test {

std::unique_ptr<Engine> open_engine(const std::string& dir, const EngineOptions& options,
                                    std::unique_ptr<ExpertProvider> experts) {
  auto ck = std::make_unique<const Checkpoint>(Checkpoint::open(dir));
  if (!experts) experts = make_resident_experts(*ck);
  return Engine::create(std::move(ck), options, std::move(experts));
}

namespace {

// One field of a session as visit_fields finds it: where it is, for messages, and the field.
struct Field {
  std::string where;
  std::variant<const int64_t*, const bool*, const std::vector<float>*, const std::vector<int32_t>*,
               const std::vector<int64_t>*> field;
};

// The fields expect_same_session compares one by one, in visit_fields' order: all of them but
// the MTP stream ring (compared row by row below); with main_layers >= 0, only the session's
// own and those of its first main_layers layers.
struct FieldList {
  const SessionState& s;
  int main_layers;
  std::vector<Field> fields = {};
  std::string where = "session";
  int index = 0;

  bool in_mtp(const void* field) const {
    const auto p = reinterpret_cast<uintptr_t>(field), m = reinterpret_cast<uintptr_t>(&s.mtp);
    return p >= m && p < m + sizeof s.mtp;
  }
  template <typename T>
  void operator()(const T& field) {
    if constexpr (std::is_same_v<T, std::vector<LayerState>>) {
      const size_t n = main_layers >= 0 ? std::min(field.size(), static_cast<size_t>(main_layers)) : field.size();
      for (size_t i = 0; i < n; ++i) {
        where = "layer " + std::to_string(i);
        index = 0;
        visit_fields(field[i], *this);
      }
      where = "session";
    } else {
      const int at = index++;
      const void* p = &field;
      if (in_mtp(p) && (main_layers >= 0 || p == &s.mtp.streams || p == &s.mtp.stream_position)) return;
      fields.push_back({where + ", field " + std::to_string(at) + " in visit_fields' order", &field});
    }
  }
};

}  // namespace

double log_z(std::span<const float> row) {
  double max = row[0];
  for (float l : row) max = std::max(max, static_cast<double>(l));
  double sum = 0;
  for (float l : row) sum += std::exp(l - max);
  return max + std::log(sum);
}

void expect_same_session(const SessionState& a, const SessionState& b, int main_layers) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  FieldList fa{a, main_layers}, fb{b, main_layers};
  visit_fields(a, fa);
  visit_fields(b, fb);
  ASSERT_EQ(fa.fields.size(), fb.fields.size());
  for (size_t i = 0; i < fa.fields.size(); ++i)
    std::visit([&](const auto* x) { EXPECT_EQ(*x, *std::get<decltype(x)>(fb.fields[i].field)) << fa.fields[i].where; },
               fa.fields[i].field);
  if (main_layers >= 0) return;
  // The MTP stream ring: rows of positions the session holds (rows a rewind took back are
  // stale until those positions are fed again, and never read before).
  ASSERT_EQ(a.mtp.stream_position.size(), b.mtp.stream_position.size());
  const size_t row = a.mtp.stream_position.empty() ? 0 : a.mtp.streams.size() / a.mtp.stream_position.size();
  for (size_t r = 0; r < a.mtp.stream_position.size(); ++r) {
    const bool held_a = a.mtp.stream_position[r] >= 0 && a.mtp.stream_position[r] < a.position;
    const bool held_b = b.mtp.stream_position[r] >= 0 && b.mtp.stream_position[r] < b.position;
    ASSERT_EQ(held_a, held_b) << "mtp stream row " << r;
    if (!held_a) continue;
    EXPECT_EQ(a.mtp.stream_position[r], b.mtp.stream_position[r]) << "mtp stream row " << r;
    EXPECT_TRUE(std::equal(a.mtp.streams.begin() + r * row, a.mtp.streams.begin() + (r + 1) * row,
                           b.mtp.streams.begin() + r * row)) << "mtp stream row " << r;
  }
}

std::vector<int32_t> pseudo_tokens(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : t) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<int32_t>(x % static_cast<uint64_t>(vocab - 2)) + 2;
  }
  return t;
}

CommandResult synth_budget_checkpoint(const std::string& dir, int vocab) {
  return run_dsv4("synth --quiet --out " + dir +
                  " --layers 2 --experts 64 --hidden 1024 --moe-inter 2048 --heads 4 --head-dim 128"
                  " --rope-dim 32 --q-lora 256 --o-groups 2 --o-lora 128 --index-heads 4"
                  " --index-head-dim 64 --index-topk 32 --vocab " + std::to_string(vocab));
}

std::string fixture(const std::string& name) { return "../shared/fixtures/" + name; }

double bytes_after(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(key + " ([0-9.]+) (GiB|MiB|KiB|B)"))) return -1;
  const double unit = m[2] == "GiB" ? double(1ull << 30) : m[2] == "MiB" ? double(1ull << 20) : m[2] == "KiB" ? 1024.0 : 1.0;
  return std::stod(m[1]) * unit;
}

TempDir::TempDir() {
  const char* base = std::getenv("DSV4_TEST_TMP");
  std::string root = base ? base : "/tmp";
  std::filesystem::create_directories(root);
  std::random_device seed;
  std::mt19937_64 rng((uint64_t(seed()) << 32) ^ seed() ^ uint64_t(platform::process_id()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string candidate = fmt::format("{}/dsv4-{:012x}", root, rng() & 0xFFFFFFFFFFFFull);
    std::error_code ec;
    if (std::filesystem::create_directory(candidate, ec)) {  // false: it existed (or failed)
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory under " + root);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(platform::fs_path(path_), ec);
}

std::string dsv4_binary() {
  const std::filesystem::path binary = platform::fs_path(DSV4_BINARY);
  if (binary.empty() || binary.is_absolute()) return DSV4_BINARY;
  return platform::utf8_path(platform::fs_path(platform::executable_path()).parent_path() / binary);
}

CommandResult run_dsv4(const std::string& args, const std::string& input, int timeout_s) {
  TempDir tmp;
  write_file(tmp / "in", input);
  CommandResult r;
  r.exit_code = platform::run_program("\"" + dsv4_binary() + "\" " + args, tmp / "in", tmp / "out", tmp / "err", timeout_s);
  r.out = read_file(tmp / "out");
  r.err = read_file(tmp / "err");
  return r;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(platform::fs_path(path), std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream f(platform::fs_path(path), std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void copy_dir(const std::string& from, const std::string& to) {
  const std::filesystem::path dst = platform::fs_path(to);
  std::filesystem::copy(platform::fs_path(from), dst, std::filesystem::copy_options::recursive);
  // Fixtures are read-only; the copies are meant to be mutated.
  for (auto& e : std::filesystem::recursive_directory_iterator(dst))
    std::filesystem::permissions(e.path(), std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
  std::filesystem::permissions(dst, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
}

}  // namespace dsv4::test
