#include "test_util.h"

#include <gtest/gtest.h>

#include "dsv4/io/checkpoint.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dsv4::test {

std::unique_ptr<Engine> open_engine(const std::string& dir, const EngineOptions& options,
                                    std::unique_ptr<ExpertProvider> experts) {
  auto ck = std::make_unique<const Checkpoint>(Checkpoint::open(dir));
  if (!experts) experts = make_resident_experts(*ck);
  return Engine::create(std::move(ck), options, std::move(experts));
}

namespace {
void expect_same_compressor(const CompressorState& a, const CompressorState& b, const std::string& where) {
  EXPECT_EQ(a.pending_kv, b.pending_kv) << where;
  EXPECT_EQ(a.pending_gate, b.pending_gate) << where;
  EXPECT_EQ(a.previous_kv, b.previous_kv) << where;
  EXPECT_EQ(a.previous_gate, b.previous_gate) << where;
  EXPECT_EQ(a.has_previous, b.has_previous) << where;
  EXPECT_EQ(a.entries, b.entries) << where;
  EXPECT_EQ(a.n_entries, b.n_entries) << where;
}

}  // namespace

double log_z(std::span<const float> row) {
  double max = row[0];
  for (float l : row) max = std::max(max, static_cast<double>(l));
  double sum = 0;
  for (float l : row) sum += std::exp(l - max);
  return max + std::log(sum);
}

void expect_same_session(const SessionState& a, const SessionState& b, int main_layers) {
  EXPECT_EQ(a.position, b.position);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  const size_t compared = main_layers >= 0 ? static_cast<size_t>(main_layers) : a.layers.size();
  for (size_t i = 0; i < compared; ++i) {
    const std::string where = "layer " + std::to_string(i);
    EXPECT_EQ(a.layers[i].window_kv, b.layers[i].window_kv) << where;
    expect_same_compressor(a.layers[i].compressor, b.layers[i].compressor, where + " compressor");
    expect_same_compressor(a.layers[i].indexer, b.layers[i].indexer, where + " indexer");
  }
  if (main_layers >= 0) return;
  // The MTP stream ring: rows of positions the session holds (rows a rewind took back are
  // stale until those positions are fed again, and never read before).
  EXPECT_EQ(a.mtp.position, b.mtp.position);
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

TempDir::TempDir() {
  const char* base = std::getenv("DSV4_TEST_TMP");
  std::string root = base ? base : "/tmp";
  std::filesystem::create_directories(root);
  std::string templ = root + "/dsv4-XXXXXX";
  if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CommandResult run_dsv4(const std::string& args, const std::string& input, int timeout_s) {
  TempDir tmp;
  write_file(tmp / "in", input);
  std::string cmd = "timeout " + std::to_string(timeout_s) + " " + DSV4_BINARY + " " + args + " <" + tmp / "in" +
                    " >" + tmp / "out" + " 2>" + tmp / "err";
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(tmp / "out");
  r.err = read_file(tmp / "err");
  return r;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void copy_dir(const std::string& from, const std::string& to) {
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
  // Fixtures are read-only; the copies are meant to be mutated.
  for (auto& e : std::filesystem::recursive_directory_iterator(to))
    std::filesystem::permissions(e.path(), std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
  std::filesystem::permissions(to, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
}

}  // namespace dsv4::test
