// The one model loader every command uses: checkpoint -> RAM plan -> expert provider ->
// engine. The plan is made (and a budget below the minimum refused) before any weight is
// read; the provider is what the plan calls for (every expert resident, or the SSD expert
// store with the planned slots); the engine sees only the ExpertProvider interface.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/experts/expert_store.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/planner.h"
#include "dsv4/runtime/settings.h"

namespace dsv4 {

// Whether the MTP drafter is loaded (its layer and experts resident, inside the budget).
enum class MtpLoad : uint8_t {
  kNo,
  kYes,  // whenever the checkpoint has a usable mtp.0 (--spec mtp, dsv4 score --mtp-logits-out)
};

struct LoadOptions {
  std::string ram = setting_default<std::string>("ram");  // --ram as given: "auto", "min", "12G"
  WorkloadShape workload;    // what the reserve must cover; also the engine's workspace shape
  EngineOptions engine;      // numerics, threads, lookahead (max_rows / context: from workload)
  ExpertStoreOptions store;  // I/O backend, queue depth (slots come from the plan)
  MtpLoad mtp = MtpLoad::kNo;
  bool print_plan = false;   // the plan's one line on stderr
  // Wraps the planned provider (the benchmark's request recorder); null: none.
  std::function<std::unique_ptr<ExpertProvider>(std::unique_ptr<ExpertProvider>)> wrap_provider;
};

struct LoadedEngine {
  MemoryPlan plan;
  std::unique_ptr<Engine> engine;
};

// Opens and validates the checkpoint in `dir`, then loads it.
LoadedEngine load_engine(const std::string& dir, LoadOptions options);
// Loads an already opened checkpoint (the benchmark probes its shards first).
LoadedEngine load_engine(std::unique_ptr<const Checkpoint> checkpoint, LoadOptions options);

// The plan load_engine() would make for this checkpoint (without loading anything).
MemoryPlan plan_for(const Checkpoint& ck, const LoadOptions& options);

// The provider a plan calls for: resident experts, or an ExpertStore with plan.slots.
std::unique_ptr<ExpertProvider> make_planned_provider(const Checkpoint& ck, const MemoryPlan& plan,
                                                      ExpertStoreOptions store);

}  // namespace dsv4
