// Helpers shared by the tests: fixture paths, temporary directories, running the CLI.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/model/engine.h"
#include "dsv4/model/session.h"

namespace dsv4::test {

// Built with AddressSanitizer: RSS measurements (shadow memory, the quarantine of freed blocks)
// say nothing about the release build's memory, so tests that measure RSS skip themselves.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

// An engine for the checkpoint in `dir` with every routed expert resident (no RAM plan), or
// with `experts` when given.
std::unique_ptr<Engine> open_engine(const std::string& dir, const EngineOptions& options = {},
                                    std::unique_ptr<ExpertProvider> experts = nullptr);

// Every field of two sessions, compared exactly (gtest expectations), as visit_fields lists
// them; the MTP stream ring only in the rows of positions the sessions hold. main_layers >= 0:
// only what the main model computes (its layers; not the MTP drafter's window and stream ring,
// which depend on when it drafted).
void expect_same_session(const SessionState& a, const SessionState& b, int main_layers = -1);

// The log of the softmax's normalizer of one logits row, in double: log-softmax(row)[i] is
// row[i] - log_z(row) (what the generator's log-probabilities are checked against).
double log_z(std::span<const float> row);

// `n` pseudo-random token ids in [2, vocab) from a xorshift generator: the same `seed` gives the
// same tokens with every standard library. Ids 0 and 1 are never drawn; the fixtures' BOS and
// EOS (496, 497) can be.
std::vector<int32_t> pseudo_tokens(size_t n, int64_t vocab, uint64_t seed);

// "../shared/fixtures/<name>" (tests run from the repository root).
std::string fixture(const std::string& name);

// The size format_bytes printed after `key` in `text` ("peak RSS 45.2 MiB" for key "peak RSS"),
// in bytes; -1 when it is not there. `key` is a plain phrase (no regex metacharacters).
double bytes_after(const std::string& text, const std::string& key);

// A fresh empty directory under the build tree, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// The dsv4 binary: DSV4_BINARY, or beside this test executable when relative (Windows); "" in
// the builds that have none.
std::string dsv4_binary();
// Runs the dsv4 binary with a quoted argument string (platform::run_program); stdin from `input`.
CommandResult run_dsv4(const std::string& args, const std::string& input = "", int timeout_s = 120);

// Writes a 2-layer synthetic checkpoint of ~400 MB (64 experts per layer, small attention) with
// a `vocab`-token vocabulary to `dir`: big enough that a 200 MiB budget must stream experts.
CommandResult synth_budget_checkpoint(const std::string& dir, int vocab);

void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);
void copy_dir(const std::string& from, const std::string& to);

}  // namespace dsv4::test
