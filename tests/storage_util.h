// Helpers of the storage tests (storage_test.cc, storage_faults_test.cc): writable fixture
// copies, byte pokes, fault rules on one expert's read, recording experts, streamed options.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dsv4/experts/expert_store.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/model_loader.h"
#include "test_util.h"

namespace dsv4::storage_test {

using test::fixture;


inline bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// A writable copy of a fixture (its files can be truncated, replaced or corrupted).
struct Copy {
  explicit Copy(const std::string& name, const std::string& sub = "ck") : dir(tmp / sub) {
    test::copy_dir(fixture(name), dir);
  }
  test::TempDir tmp;
  std::string dir;
};

inline void poke(const std::string& path, uint64_t offset, uint8_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(value));
  ASSERT_TRUE(f.good()) << path;
}

inline std::vector<uint8_t> file_bytes(const SafetensorsFile& shard, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> out(n);
  shard.file().read_exact(out.data(), n, offset);
  return out;
}

// Every part of an acquired expert equals the checkpoint's bytes.
inline void expect_checkpoint_bytes(const Checkpoint& ck, const ExpertWeights& w, int layer, int expert) {
  const ExpertLocation loc = locate_expert(ck, layer, expert);
  const kernels::Matrix* m[3] = {&w.w1, &w.w3, &w.w2};
  for (int part = 0; part < 6; ++part) {
    const std::vector<uint8_t> want = file_bytes(*loc.parts[part].shard, loc.parts[part].offset, loc.parts[part].bytes);
    const uint8_t* got = part % 2 ? m[part / 2]->scales : static_cast<const uint8_t*>(m[part / 2]->data);
    ASSERT_EQ(std::memcmp(got, want.data(), want.size()), 0) << "layer " << layer << " expert " << expert;
  }
}

// A fault rule on the read of one expert (a byte in the middle of its w1 weight).
inline std::string fault_on_expert(const Checkpoint& ck, const std::string& kind, int layer, int expert,
                            const std::string& extra = "") {
  const ExpertLocation loc = locate_expert(ck, layer, expert);
  return fmt::format("{}:path={}:offset={}{}", kind, loc.parts[0].shard->path(),
                     loc.parts[0].offset + loc.parts[0].bytes / 2, extra);
}

// Resident experts that record which (layer, expert) pairs were acquired.
class RecordingExperts final : public ExpertProvider {
 public:
  explicit RecordingExperts(const Checkpoint& ck) : inner_(make_resident_experts(ck)) {}
  void prefetch(int layer, std::span<const int> experts) override { inner_->prefetch(layer, experts); }
  const ExpertWeights& acquire(int layer, int expert) override {
    acquired.push_back({layer, expert});
    return inner_->acquire(layer, expert);
  }
  void release(int layer, int expert) override { inner_->release(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  std::vector<std::pair<int, int>> acquired;

 private:
  std::unique_ptr<ExpertProvider> inner_;
};

inline ExpertStoreOptions store_options(IoBackend backend, int slots = 4) {
  ExpertStoreOptions o;
  o.slots = slots;
  o.backend = backend;
  o.quiet = true;
  return o;
}

inline LoadOptions streamed(IoBackend backend, std::shared_ptr<IoFaults> faults = nullptr) {
  LoadOptions o;
  o.engine.numerics = kernels::Numerics::kReference;
  o.engine.threads = 1;
  o.ram = "min";
  o.print_plan = false;
  o.store.backend = backend;
  o.store.quiet = true;
  o.store.faults = std::move(faults);
  return o;
}

inline constexpr IoBackend kBackends[] = {IoBackend::kNative, IoBackend::kThreads};
inline const char* name(IoBackend b) { return b == IoBackend::kThreads ? "threads" : "io_uring"; }

struct BadScale {
  int layer = 2, expert = 5;
  uint8_t code;
};

inline std::string corrupt_scale(const std::string& dir, const BadScale& b) {
  Checkpoint ck = Checkpoint::open(dir);
  const ExpertLocation loc = locate_expert(ck, b.layer, b.expert);
  poke(loc.parts[3].shard->path(), loc.parts[3].offset + 7, b.code);  // w3.scale, index 7
  return loc.parts[3].shard->path();
}

inline std::vector<int32_t> short_prompt() { return {496, 499}; }

// Teacher-forced logits of a prompt (throws what the engine throws).
inline std::vector<float> score(Engine& e, const std::vector<int32_t>& tokens) {
  std::vector<float> logits(tokens.size() * e.config().vocab_size);
  SessionState s = e.new_session();
  e.forward(s, tokens, logits.data(), LogitRows::kAll, 4);
  return logits;
}

// Every routed expert of every layer is used by this prompt in prefill (checked below), so a
// bad expert anywhere is met.
inline std::vector<int32_t> long_prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 120; ++i) p.push_back((i * 37 + 11) % 500);
  return p;
}

}  // namespace dsv4::storage_test
