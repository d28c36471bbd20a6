// The engine: loaded weights (dense part resident, routed experts behind an
// ExpertProvider) and the forward pass. Sessions hold all per-sequence state, so several
// sessions can share one engine; forward calls are serialized by the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/experts/planner.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/rope.h"
#include "dsv4/model/session.h"
#include "dsv4/model/weights.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4 {

// Which layers' routed experts the engine guesses ahead (see expert_lookahead.h).
// kExact: only hash-routed layers, whose experts follow from the token ids (never wrong);
// kAll: also top-k layers, by running their router early (twice per layer). The default:
// on the 4-layer synthetic checkpoint it cut the decode time blocked on reads to about a
// third of kExact's, and the decode time by ~8 % (docs/benchmarks.md).
enum class ExpertLookahead : uint8_t { kOff, kExact, kAll };

struct EngineOptions {
  kernels::Numerics numerics = kernels::Numerics::kFast;
  int threads = 0;  // 0: all available CPUs
  // Routed experts. Unset: all resident (no planning). Set (--ram: "12G", "min", "" for the
  // default share of available memory): the planner sizes an SSD expert cache from this
  // process budget, prints its one-line plan on stderr, and refuses a budget below the
  // minimum before any weight is loaded.
  std::optional<std::string> ram;
  WorkloadShape workload;     // what the reserve for KV state and activations must cover
  ExpertStoreOptions store;   // I/O backend, queue depth (slots come from the plan)
  ExpertLookahead lookahead = ExpertLookahead::kAll;
  bool print_plan = true;
};

class Engine {
 public:
  // Opens and validates the checkpoint and loads the dense weights. With no provider the
  // routed experts are read into RAM.
  static std::unique_ptr<Engine> open(const std::string& dir, const EngineOptions& options,
                                      std::unique_ptr<ExpertProvider> experts = nullptr);

  const ModelConfig& config() const { return checkpoint_.config(); }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  const ModelWeights& weights() const { return weights_; }
  ExpertProvider& experts() { return *experts_; }
  kernels::Numerics numerics() const { return options_.numerics; }
  // The RAM plan, if the engine was opened with a budget.
  const std::optional<MemoryPlan>& memory_plan() const { return plan_; }
  int threads() const { return pool_.size(); }

  SessionState new_session() const;

  // Feeds `tokens` to the session in chunks of at most `chunk` tokens (0 = one chunk).
  // logits: null, or [tokens.size(), vocab] (all_positions) / [vocab] (last position only).
  // Throws Error on a token id outside the vocabulary or a session past the context limit.
  void forward(SessionState& session, std::span<const int32_t> tokens, float* logits, bool all_positions,
               int64_t chunk = 0);

 private:
  Engine(Checkpoint ck, const EngineOptions& options, std::unique_ptr<ExpertProvider> experts);
  void forward_chunk(SessionState& s, std::span<const int32_t> tokens, float* logits, bool all_positions);

  Checkpoint checkpoint_;
  EngineOptions options_;
  std::optional<MemoryPlan> plan_;  // before weights_: a refused budget fails before loading
  ModelWeights weights_;
  std::unique_ptr<ExpertProvider> experts_;
  std::vector<Rope> ropes_;  // per layer
  ThreadPool pool_;
  std::mutex forward_mutex_;
};

}  // namespace dsv4
