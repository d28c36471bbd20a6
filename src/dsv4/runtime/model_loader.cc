#include "dsv4/runtime/model_loader.h"

#include <cstdio>

#include "dsv4/util/error.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4 {

std::unique_ptr<ExpertProvider> make_planned_provider(const Checkpoint& ck, const MemoryPlan& plan,
                                                      ExpertStoreOptions store) {
  if (plan.all_resident) {
    check_mirrors(ck, store.mirrors);  // read by no one here, but a bad one is refused all the same
    return make_resident_experts(ck, store.faults.get());
  }
  store.slots = plan.slots;
  return std::make_unique<ExpertStore>(ck, store);
}

LoadedEngine load_engine(const std::string& dir, LoadOptions options) {
  // Shards missing from `dir` may be in the mirror folders (a checkpoint spread over drives).
  auto ck = std::make_unique<const Checkpoint>(Checkpoint::open(dir, options.store.mirrors));
  return load_engine(std::move(ck), std::move(options));
}

namespace {

// The workload as the engine will really run it: the context within the model's, passes no
// longer than the context, the pool's thread count; the engine's workspace gets that shape.
void settle_shape(const Checkpoint& ck, LoadOptions& o) {
  const ModelConfig& c = ck.config();
  WorkloadShape& w = o.workload;
  w.context_tokens = std::max<int64_t>(1, std::min(w.context_tokens, c.max_position_embeddings));
  w.chunk_tokens = std::max<int64_t>(1, std::min(w.chunk_tokens, w.context_tokens));
  w.threads = o.engine.threads > 0 ? o.engine.threads : available_cpus();
  o.engine.max_rows = w.chunk_tokens;
  o.engine.context = w.context_tokens;
  o.engine.mtp = o.mtp != MtpLoad::kNo && ck.has_mtp();
  w.mtp = o.engine.mtp;
  w.admit_rows = o.engine.batch_prompt_rows;  // sizes the logs of shared passes
}

MemoryPlan settle_plan(const Checkpoint& ck, LoadOptions& o) {
  settle_shape(ck, o);
  MemoryPlan plan = plan_memory(ck, parse_ram(o.ram), o.workload);
  // The chunk the plan chose (or the given one) is the engine's workspace shape.
  o.workload.chunk_tokens = plan.chunk_tokens;
  o.workload.auto_chunk = false;
  o.engine.max_rows = plan.chunk_tokens;
  return plan;
}

}  // namespace

MemoryPlan plan_for(const Checkpoint& ck, const LoadOptions& options) {
  LoadOptions o = options;
  return settle_plan(ck, o);
}

LoadedEngine load_engine(std::unique_ptr<const Checkpoint> ck, LoadOptions o) {
  LoadedEngine loaded;
  loaded.plan = settle_plan(*ck, o);
  if (o.print_plan) std::fprintf(stderr, "%s\n", loaded.plan.summary().c_str());
  std::unique_ptr<ExpertProvider> experts = make_planned_provider(*ck, loaded.plan, o.store);
  if (o.wrap_provider) experts = o.wrap_provider(std::move(experts));
  if (!o.engine.faults) o.engine.faults = o.store.faults;  // the dense reads see the same faults
  loaded.engine = Engine::create(std::move(ck), o.engine, std::move(experts));
  return loaded;
}

}  // namespace dsv4
