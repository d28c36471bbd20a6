// The SSD expert store: bit-identical results at every budget, the cache's invariants
// (bytes equal the checkpoint's, pinned experts stay, read errors name the shard), the
// planner and --ram, and peak RSS within the budget.
#include <gtest/gtest.h>


#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/experts/expert_layout.h"
#include "dsv4/experts/expert_store.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/runtime/planner.h"
#include "dsv4/platform/platform.h"
#include "dsv4/platform/read_queue.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/io/schema.h"
#include "dsv4/model/engine.h"
#include "dsv4/model/undo_log.h"
#include "dsv4/runtime/speculative.h"
#include "dsv4/util/error.h"
#include "dsv4/util/memory.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::kAsan;

using kernels::Numerics;
using test::fixture;

std::vector<int32_t> ids(const nlohmann::json& a) { return a.get<std::vector<int32_t>>(); }

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// A budget "min", "middle" (half the experts cached) or "all".
std::string budget(const std::string& dir, const std::string& which) {
  if (which == "min") return "min";
  Checkpoint ck = Checkpoint::open(dir);
  const MemoryPlan min = plan_memory(ck, parse_ram("min"), WorkloadShape{});
  if (which == "middle") return std::to_string(min.minimum_budget + uint64_t(min.total_experts / 2) * min.slot_bytes);
  return "64G";
}

struct Budgeted {
  std::string fixture, budget;
  IoBackend backend;
  bool direct;
  ExpertLookahead lookahead = ExpertLookahead::kExact;
  CachePolicyKind policy = CachePolicyKind::kFreq;
};

void PrintTo(const Budgeted& b, std::ostream* os) {
  *os << b.fixture << " at " << b.budget << " (" << cache_policy_name(b.policy) << ")";
}

LoadedEngine open_budgeted(const Budgeted& b) {
  LoadOptions o;
  o.engine.numerics = Numerics::kReference;
  o.engine.threads = 1;  // one compute thread: the tests stay fast on a loaded 2-core machine
  o.engine.lookahead = b.lookahead;
  o.ram = budget(fixture(b.fixture), b.budget);
  o.store.backend = b.backend;
  o.store.direct_io = b.direct;
  o.store.cache_policy = b.policy;
  return load_engine(fixture(b.fixture), o);
}

// What every budgeted run is compared with: all experts resident, same chunking.
struct Baseline {
  std::vector<std::vector<float>> sequences;  // teacher-forced logits
  std::vector<std::vector<float>> greedy;     // logits of each greedy step
  std::vector<std::vector<int32_t>> greedy_tokens;
};

struct Workload {
  std::vector<std::vector<int32_t>> sequences;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> want_tokens;  // the reference's greedy continuations
  int64_t chunk = 7;
  int steps = 12;
};

Workload workload(const std::string& name) {
  nlohmann::json ref = nlohmann::json::parse(test::read_file(fixture(name) + "/reference.json"));
  Workload w;
  if (name == "flashlike") {
    w.sequences.push_back(ids(ref["sequences"][1]["tokens"]));  // 301 tokens
    w.chunk = 64;
    for (int g : {1, 2}) {
      w.prompts.push_back(ids(ref["greedy"][g]["prompt"]));
      w.want_tokens.push_back(ids(ref["greedy"][g]["new_tokens"]));
    }
  } else {
    for (const auto& s : ref["sequences"]) w.sequences.push_back(ids(s["tokens"]));
    for (int g : {0, 4}) {
      w.prompts.push_back(ids(ref["greedy"][g]["prompt"]));
      w.want_tokens.push_back(ids(ref["greedy"][g]["new_tokens"]));
    }
  }
  return w;
}

Baseline run(Engine& e, const Workload& w) {
  Baseline b;
  const int64_t V = e.config().vocab_size;
  for (const auto& tokens : w.sequences) {
    std::vector<float> out(tokens.size() * V);
    SessionState s = e.new_session();
    e.forward(s, tokens, out.data(), LogitRows::kAll, w.chunk);
    b.sequences.push_back(std::move(out));
  }
  for (const auto& prompt : w.prompts) {
    SessionState s = e.new_session();
    std::vector<float> logits(V), all;
    std::vector<int32_t> tokens;
    e.forward(s, prompt, logits.data(), LogitRows::kLast, w.chunk);
    for (int i = 0; i < w.steps; ++i) {
      all.insert(all.end(), logits.begin(), logits.end());
      int32_t next = argmax(logits);
      tokens.push_back(next);
      e.forward(s, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
    }
    b.greedy.push_back(std::move(all));
    b.greedy_tokens.push_back(std::move(tokens));
  }
  return b;
}

const Baseline& resident_baseline(const std::string& name) {
  static std::map<std::string, Baseline> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  EngineOptions o;
  o.numerics = Numerics::kReference;
  o.threads = 1;  // one compute thread: the tests stay fast on a loaded 2-core machine
  auto e = test::open_engine(fixture(name), o);
  return cache[name] = run(*e, workload(name));
}

class ExpertStoreBitExact : public ::testing::TestWithParam<Budgeted> {};

// Logits and greedy tokens bit-identical to the all-resident engine at the minimum budget
// and in the middle, with either read queue, with buffered reads, and whatever the lookahead
// guesses.
TEST_P(ExpertStoreBitExact, SameBitsAsResident) {
  const Budgeted& b = GetParam();
  const Workload w = workload(b.fixture);
  const Baseline& want = resident_baseline(b.fixture);
  LoadedEngine loaded = open_budgeted(b);
  ASSERT_FALSE(loaded.plan.all_resident);
  Engine* engine = loaded.engine.get();
  const Baseline got = run(*engine, w);
  for (size_t i = 0; i < want.sequences.size(); ++i) {
    ASSERT_EQ(got.sequences[i].size(), want.sequences[i].size());
    EXPECT_EQ(std::memcmp(got.sequences[i].data(), want.sequences[i].data(), want.sequences[i].size() * 4), 0)
        << "sequence " << i;
  }
  for (size_t g = 0; g < want.greedy.size(); ++g) {
    EXPECT_EQ(got.greedy_tokens[g], want.greedy_tokens[g]) << "greedy " << g;
    for (int i = 0; i < w.steps; ++i) EXPECT_EQ(got.greedy_tokens[g][i], w.want_tokens[g][i]) << "greedy " << g;
    EXPECT_EQ(std::memcmp(got.greedy[g].data(), want.greedy[g].data(), want.greedy[g].size() * 4), 0)
        << "greedy " << g;
  }
  const ExpertStats s = engine->experts().stats();
  std::printf("%s at %s, %s: %llu requests, %llu hits, %llu reads, %.3f s blocked\n", b.fixture.c_str(),
              b.budget.c_str(), cache_policy_name(b.policy), static_cast<unsigned long long>(s.requests),
              static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.reads), s.blocked_seconds);
  EXPECT_GT(s.reads, 0u);
  EXPECT_EQ(s.hits + s.misses, s.requests);
  EXPECT_LE(s.misses, s.reads);
}

INSTANTIATE_TEST_SUITE_P(
    Budgets, ExpertStoreBitExact,
    ::testing::Values(Budgeted{"tiny-a", "min", IoBackend::kNative, true},
                      Budgeted{"tiny-a", "middle", IoBackend::kThreads, true},
                      Budgeted{"tiny-a", "min", IoBackend::kThreads, false},
                      Budgeted{"flashlike", "min", IoBackend::kAuto, true, ExpertLookahead::kAll},
                      Budgeted{"flashlike", "middle", IoBackend::kNative, true},
                      Budgeted{"tiny-a", "min", IoBackend::kNative, true, ExpertLookahead::kOff},
                      // The same under LRU eviction: the policy changes what is cached, never the bits.
                      Budgeted{"tiny-a", "min", IoBackend::kNative, true, ExpertLookahead::kExact, CachePolicyKind::kLru},
                      Budgeted{"tiny-a", "middle", IoBackend::kThreads, true, ExpertLookahead::kExact,
                               CachePolicyKind::kLru},
                      Budgeted{"flashlike", "min", IoBackend::kAuto, true, ExpertLookahead::kAll, CachePolicyKind::kLru},
                      Budgeted{"flashlike", "middle", IoBackend::kNative, true, ExpertLookahead::kExact,
                               CachePolicyKind::kLru}),
    [](const auto& info) {
      const Budgeted& b = info.param;
      std::string name = b.fixture + "_" + b.budget + "_" + (b.backend == IoBackend::kThreads ? "threads" : "uring") +
                         (b.direct ? "" : "_buffered") +
                         (b.lookahead == ExpertLookahead::kAll   ? "_lookahead_all"
                          : b.lookahead == ExpertLookahead::kOff ? "_no_lookahead"
                                                                 : "") +
                         (b.policy == CachePolicyKind::kLru ? "_lru" : "");
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

// Resident experts that claim only some experts are "ready" (here: ids not divisible by
// 3, so the MoE computes those first and the others after): the logits must not change.
class ArrivalOrderExperts final : public ExpertProvider {
 public:
  explicit ArrivalOrderExperts(const Checkpoint& ck) : inner_(make_resident_experts(ck)) {}
  void prefetch(int layer, std::span<const int> experts) override { inner_->prefetch(layer, experts); }
  bool ready(int, int expert) const override { return expert % 3 != 0; }
  const ExpertWeights& acquire(int layer, int expert) override {
    order_.push_back(expert);
    return inner_->acquire(layer, expert);
  }
  void release(int layer, int expert) override { inner_->release(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  const std::vector<int>& order() const { return order_; }

 private:
  std::unique_ptr<ExpertProvider> inner_;
  std::vector<int> order_;
};

TEST(MoeArrivalOrder, ComputesReadyExpertsFirstWithTheSameBits) {
  for (const char* name : {"tiny-a", "flashlike"}) {
    const Workload w = workload(name);
    const Baseline& want = resident_baseline(name);
    EngineOptions o;
    o.numerics = Numerics::kReference;
    o.threads = 1;
    auto provider = std::make_unique<ArrivalOrderExperts>(Checkpoint::open(fixture(name)));
    const ArrivalOrderExperts* arrivals = provider.get();
    auto engine = test::open_engine(fixture(name), o, std::move(provider));
    const Baseline got = run(*engine, w);
    for (size_t i = 0; i < want.sequences.size(); ++i)
      EXPECT_EQ(std::memcmp(got.sequences[i].data(), want.sequences[i].data(), want.sequences[i].size() * 4), 0)
          << name << " sequence " << i;
    for (size_t g = 0; g < want.greedy.size(); ++g)
      EXPECT_EQ(std::memcmp(got.greedy[g].data(), want.greedy[g].data(), want.greedy[g].size() * 4), 0)
          << name << " greedy " << g;
    // The order really changed: some expert divisible by 3 was computed after a larger id.
    bool reordered = false;
    for (size_t i = 1; i < arrivals->order().size(); ++i)
      reordered |= arrivals->order()[i - 1] % 3 != 0 && arrivals->order()[i] % 3 == 0 &&
                   arrivals->order()[i] < arrivals->order()[i - 1];
    EXPECT_TRUE(reordered) << name;
  }
}

// ready() says whether acquire() would return at once.
TEST(ExpertStore, ReadyMeansInMemory) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  ExpertStoreOptions o;
  o.slots = 4;
  ExpertStore store(ck, o);
  EXPECT_FALSE(store.ready(1, 0));
  store.acquire(1, 0);
  EXPECT_TRUE(store.ready(1, 0));
  store.release(1, 0);
  EXPECT_TRUE(store.ready(1, 0));
  EXPECT_FALSE(store.ready(1, 1));
  EXPECT_THROW((void)store.ready(1, 9999), Error);
}

// Once a layer's routing is known (prefetch), its guesses still waiting are dropped: only
// the guess already in flight is read.
TEST(ExpertStore, PrefetchDropsTheLayersQueuedGuesses) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  ExpertStoreOptions o;
  o.slots = 8;
  o.max_predicted_in_flight = 1;
  ExpertStore store(ck, o);
  const int guess[] = {0, 1, 2, 3, 4, 5};
  const int needed[] = {5};
  store.predict(2, guess);  // starts reading expert 0; 1-5 wait
  store.prefetch(2, needed);
  store.acquire(2, 5);
  store.release(2, 5);
  store.acquire(2, 0);  // the guess in flight lands and is used
  store.release(2, 0);
  const ExpertStats s = store.stats();
  EXPECT_EQ(s.predicted_reads, 1u);
  EXPECT_EQ(s.reads, 2u);
  for (int e : {1, 2, 3, 4}) EXPECT_FALSE(store.ready(2, e)) << e;
}

// Every expert's six parts, read through the store (including the expert whose weight and
// scale sit in different shards), equal the checkpoint's bytes.
TEST(ExpertStore, BytesMatchCheckpoint) {
  for (const char* name : {"tiny-a", "flashlike"}) {
    for (IoBackend backend : {IoBackend::kNative, IoBackend::kThreads}) {
      Checkpoint ck = Checkpoint::open(fixture(name));
      ExpertStoreOptions o;
      o.slots = 3;
      o.backend = backend;
      ExpertStore store(ck, o);
      const ModelConfig& c = ck.config();
      for (int l = 0; l < c.num_layers; ++l) {
        for (int e = 0; e < c.n_routed_experts; ++e) {
          const ExpertWeights& w = store.acquire(l, e);
          const ExpertLocation loc = locate_expert(ck, l, e);
          const kernels::Matrix* m[3] = {&w.w1, &w.w3, &w.w2};
          for (int part = 0; part < 6; ++part) {
            std::vector<uint8_t> want(loc.parts[part].bytes);
            loc.parts[part].shard->file().read_exact(want.data(), want.size(), loc.parts[part].offset);
            const kernels::Matrix& mat = *m[part / 2];
            const uint8_t* got = part % 2 ? mat.scales : static_cast<const uint8_t*>(mat.data);
            ASSERT_EQ(std::memcmp(got, want.data(), want.size()), 0) << name << " layer " << l << " expert " << e;
          }
          store.release(l, e);
        }
      }
      EXPECT_EQ(store.stats().misses, uint64_t(c.num_layers) * c.n_routed_experts);
    }
  }
}

// The split expert of the fixture is read as one window per shard.
TEST(ExpertStore, LayoutSplitsWindowsAcrossShards) {
  Checkpoint ck = Checkpoint::open(fixture("flashlike"));
  ExpertLayout layout(ck);
  const ExpertReadPlan& split = layout.plan(3, 8);
  ASSERT_EQ(split.windows.size(), 2u);
  EXPECT_NE(split.windows[0].shard, split.windows[1].shard);
  for (const ReadWindow& w : split.windows) {
    EXPECT_EQ(w.file_offset % kDirectAlign, 0u);
    EXPECT_EQ(w.length % kDirectAlign, 0u);
    EXPECT_EQ(w.slot_offset % kDirectAlign, 0u);
    EXPECT_LE(w.needed, w.length);
  }
  EXPECT_EQ(layout.plan(0, 0).windows.size(), 1u);  // contiguous parts: one read
  EXPECT_LE(split.slot_bytes, layout.slot_bytes());
}

// Acquired experts are never evicted; with every slot pinned a new expert is refused
// instead of hanging or evicting.
TEST(ExpertStore, PinnedExpertsAreNeverEvicted) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  ExpertStoreOptions o;
  o.slots = 2;
  ExpertStore store(ck, o);
  const ExpertWeights& a = store.acquire(0, 0);
  const ExpertWeights& b = store.acquire(0, 1);
  std::vector<uint8_t> a_bytes(static_cast<const uint8_t*>(a.w1.data),
                               static_cast<const uint8_t*>(a.w1.data) + a.w1.data_bytes());
  const int other[] = {2, 3, 4};
  store.predict(1, other);   // guesses may not take pinned slots
  store.prefetch(1, other);  // nor may needed experts
  try {
    store.acquire(0, 2);
    FAIL() << "acquire with every slot pinned must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all 2 expert slots are pinned"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(a.w1.data, a_bytes.data(), a_bytes.size()), 0);
  store.release(0, 1);
  const ExpertWeights& c = store.acquire(0, 2);  // takes b's slot, not a's
  EXPECT_EQ(std::memcmp(a.w1.data, a_bytes.data(), a_bytes.size()), 0);
  EXPECT_NE(c.w1.data, a.w1.data);
  (void)b;
  store.release(0, 2);
  store.release(0, 0);
  EXPECT_THROW(store.release(0, 0), Error);   // not acquired any more
  EXPECT_THROW(store.acquire(99, 0), Error);  // no such layer
}

// Hits are reuses of cached experts; misses are experts read for the request.
TEST(ExpertStore, CountsHitsMissesAndBytes) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  ExpertLayout layout(ck);
  ExpertStoreOptions o;
  o.slots = 4;
  ExpertStore store(ck, o);
  for (int round = 0; round < 3; ++round) {
    for (int e : {0, 1, 2}) {
      store.acquire(2, e);
      store.release(2, e);
    }
  }
  const ExpertStats s = store.stats();
  EXPECT_EQ(s.requests, 9u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.hits, 6u);
  EXPECT_EQ(s.reads, 3u);
  EXPECT_EQ(s.demand_reads, 3u);
  EXPECT_EQ(s.bytes_read, layout.plan(2, 0).read_bytes + layout.plan(2, 1).read_bytes + layout.plan(2, 2).read_bytes);
  EXPECT_GT(s.read_seconds, 0.0);
  const ExpertStats d = s - s;
  EXPECT_EQ(d.requests, 0u);
}

// A shard that goes bad after opening: the read error names the shard, the store stays
// usable for other experts and shuts down cleanly.
TEST(ExpertStore, ReadErrorNamesTheShard) {
  for (IoBackend backend : {IoBackend::kNative, IoBackend::kThreads}) {
    test::TempDir tmp;
    const std::string dir = tmp / "ck";
    test::copy_dir(fixture("tiny-a"), dir);
    Checkpoint ck = Checkpoint::open(dir);
    const ExpertLocation loc = locate_expert(ck, 4, 0);
    const std::string shard = loc.parts[0].shard->path();
    ExpertStoreOptions o;
    o.slots = 3;
    o.backend = backend;
    ExpertStore store(ck, o);
    std::filesystem::resize_file(shard, 4096);
    try {
      store.acquire(4, 0);
      FAIL() << "reading a truncated shard must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(shard), std::string::npos) << e.what();
    }
    // An expert in another shard still loads.
    Checkpoint fresh = Checkpoint::open(fixture("tiny-a"));
    for (int l = 0; l < 6; ++l) {
      if (locate_expert(fresh, l, 0).parts[0].shard->path().find(std::filesystem::path(shard).filename().string()) ==
          std::string::npos) {
        store.acquire(l, 0);
        store.release(l, 0);
        break;
      }
    }
  }
}

// A direct read the kernel refuses (EINVAL: here a misaligned buffer) is retried through
// the page cache and reported, so the store can say so once and switch that shard over.
TEST(ReadQueue, FallsBackToBufferedWhenDirectIsRefused) {
  const std::string path = Checkpoint::open(fixture("tiny-a")).shards()[0]->path();
  File buffered = File::open_read(path);
  File direct = File::open_direct(path);
  if (!direct.valid()) GTEST_SKIP() << "no O_DIRECT on this filesystem";
  std::vector<uint8_t> want(8192);
  buffered.read_exact(want.data(), want.size(), 4096);
  for (bool uring : {true, false}) {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    ReadOutcome got;
    auto on_done = [&](uint64_t, const ReadOutcome& o) {
      std::lock_guard<std::mutex> lock(mutex);
      got = o;
      done = true;
      cv.notify_all();
    };
    std::unique_ptr<ReadQueue> q = uring ? make_native_read_queue(2, on_done) : make_thread_read_queue(2, on_done);
    ASSERT_NE(q, nullptr);
    AlignedBuffer buffer(3 * 4096);
    ReadOp op;
    op.fd = direct.fd();
    op.buffered_fd = buffered.fd();
    op.shard = 7;
    op.path = &path;
    op.offset = 4096;
    op.length = op.needed = 8192;
    op.dst = buffer.data() + 1;  // misaligned: O_DIRECT says EINVAL
    q->submit(1, {op});
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done; });
    EXPECT_EQ(got.error, "") << q->name();
    ASSERT_EQ(got.refused_direct, std::vector<int>{7}) << q->name();
    EXPECT_EQ(std::memcmp(buffer.data() + 1, want.data(), want.size()), 0) << q->name();
  }
}

TEST(Planner, ParsesRamSizes) {
  EXPECT_EQ(parse_ram("512M").bytes, 512ull << 20);
  EXPECT_EQ(parse_ram("24G").bytes, 24ull << 30);
  EXPECT_EQ(parse_ram("1.5G").bytes, 3ull << 29);
  EXPECT_EQ(parse_ram("2GiB").bytes, 2ull << 30);
  EXPECT_EQ(parse_ram("min").kind, RamRequest::Kind::kMinimum);
  EXPECT_EQ(parse_ram("auto").kind, RamRequest::Kind::kDefault);
  for (const char* bad : {"abc", "-1G", "1X", "0", "12", "G", "1.5.G", " 1G", "", "default", "1e9", "1G ", "+1G",
                          "0x10G", "2000000000G", "1.5"}) {
    try {
      parse_ram(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--ram"), std::string::npos) << e.what();
    }
  }
}

TEST(Planner, SlotsFromTheBudget) {
  Checkpoint ck = Checkpoint::open(fixture("flashlike"));
  const WorkloadShape w;
  const MemoryPlan min = plan_memory(ck, parse_ram("min"), w);
  EXPECT_FALSE(min.all_resident);
  EXPECT_EQ(min.slots, 2 * ck.config().n_experts_per_token);
  EXPECT_EQ(min.budget, min.minimum_budget);
  EXPECT_LE(min.projected_peak(), min.budget);
  EXPECT_EQ(min.total_experts, int64_t(ck.config().num_layers) * ck.config().n_routed_experts);

  const MemoryPlan mid = plan_memory(ck, parse_ram(std::to_string(min.budget + 40 * min.slot_bytes)), w);
  EXPECT_EQ(mid.slots, min.slots + 40);
  EXPECT_LE(mid.projected_peak(), mid.budget);

  const MemoryPlan all = plan_memory(ck, parse_ram("4G"), w);
  EXPECT_TRUE(all.all_resident);
  const std::string line = all.summary();
  EXPECT_NE(line.find("ram plan: budget 4.00 GiB"), std::string::npos) << line;
  EXPECT_NE(line.find("resident"), std::string::npos) << line;

  try {
    plan_memory(ck, parse_ram(std::to_string(min.budget - 1)), w);
    FAIL() << "a budget below the minimum must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--ram"), std::string::npos) << msg;
    EXPECT_NE(msg.find("below the minimum of " + format_bytes(min.minimum_budget)), std::string::npos) << msg;
  }
  // A longer context needs a bigger reserve.
  WorkloadShape long_ctx;
  long_ctx.context_tokens = 1 << 20;
  EXPECT_GT(plan_memory(ck, parse_ram("min"), long_ctx).reserve_bytes, min.reserve_bytes);
}

// --chunk 0: the largest chunk the budget allows, up to the longest prompt.
TEST(Planner, AutomaticChunk) {
  Checkpoint ck = Checkpoint::open(fixture("flashlike"));
  WorkloadShape w;
  w.context_tokens = 1 << 16;
  choose_chunk(w, 0, w.context_tokens);
  EXPECT_TRUE(w.auto_chunk);
  WorkloadShape base = w;  // the same workload at the base chunk
  base.auto_chunk = false;
  base.chunk_tokens = kAutoChunkTokens;
  auto at = [&](uint64_t budget, int64_t chunk) {
    WorkloadShape s = base;
    s.chunk_tokens = chunk;
    return plan_memory(ck, parse_ram(std::to_string(budget)), s);
  };

  // Every expert resident at the base chunk: the chunk grows while they stay resident.
  const MemoryPlan resident_base = plan_memory(ck, parse_ram("4G"), base);
  ASSERT_TRUE(resident_base.all_resident);
  EXPECT_EQ(resident_base.chunk_tokens, kAutoChunkTokens);
  EXPECT_FALSE(resident_base.chunk_chosen);
  const uint64_t tight = resident_base.projected_peak() + 1000 * resident_base.workspace_row_bytes;
  const MemoryPlan grown = plan_memory(ck, parse_ram(std::to_string(tight)), w);
  EXPECT_TRUE(grown.all_resident);
  EXPECT_TRUE(grown.chunk_chosen);
  EXPECT_GT(grown.chunk_tokens, kAutoChunkTokens + 500);
  EXPECT_LE(grown.projected_peak(), grown.budget);
  EXPECT_EQ(grown.reserve_bytes, at(tight, grown.chunk_tokens).reserve_bytes);
  EXPECT_TRUE(at(tight, grown.chunk_tokens).all_resident);
  EXPECT_FALSE(at(tight, grown.chunk_tokens + 1).all_resident);  // the largest that keeps them
  // A budget with room to spare: the whole context in one pass.
  const MemoryPlan whole = plan_memory(ck, parse_ram("4G"), w);
  EXPECT_EQ(whole.chunk_tokens, w.context_tokens);
  EXPECT_TRUE(whole.all_resident);

  // Streamed: the workspace may take half of the base plan's expert cache, no more.
  const MemoryPlan min = plan_memory(ck, parse_ram("min"), base);
  const uint64_t streamed_budget = min.budget + 40 * min.slot_bytes;
  const MemoryPlan streamed_base = at(streamed_budget, kAutoChunkTokens);
  const MemoryPlan streamed = plan_memory(ck, parse_ram(std::to_string(streamed_budget)), w);
  ASSERT_FALSE(streamed_base.all_resident);
  EXPECT_FALSE(streamed.all_resident);
  EXPECT_GT(streamed.chunk_tokens, kAutoChunkTokens);
  EXPECT_LT(streamed.chunk_tokens, w.context_tokens);
  const uint64_t base_left = streamed_budget - streamed_base.dense_bytes - streamed_base.reserve_bytes;
  EXPECT_LE(streamed.reserve_bytes - streamed_base.reserve_bytes, base_left / 2);
  EXPECT_GT(at(streamed_budget, streamed.chunk_tokens + 1).reserve_bytes - streamed_base.reserve_bytes, base_left / 2);
  EXPECT_GE(streamed.slots, streamed.min_slots);
  EXPECT_LE(streamed.projected_peak(), streamed.budget);
  // --ram min leaves nothing to grow into; a given --chunk is kept.
  EXPECT_EQ(plan_memory(ck, parse_ram("min"), w).chunk_tokens, kAutoChunkTokens);
  WorkloadShape given = w;
  choose_chunk(given, 7, w.context_tokens);
  EXPECT_EQ(plan_memory(ck, parse_ram("4G"), given).chunk_tokens, 7);
  // A context shorter than the base: one pass.
  WorkloadShape short_ctx = w;
  short_ctx.context_tokens = 100;
  EXPECT_EQ(plan_memory(ck, parse_ram("min"), short_ctx).chunk_tokens, 100);

  // The plan line shows the chunk, the workspace and the session state per token of context.
  const std::string line = streamed.summary();
  EXPECT_NE(line.find(fmt::format("chunk {} rows auto", streamed.chunk_tokens)), std::string::npos) << line;
  EXPECT_NE(line.find("B/token"), std::string::npos) << line;
  EXPECT_NE(line.find("/row"), std::string::npos) << line;
}

// The session state the planner reserves per token of context, against what a session fed
// that many tokens holds.
TEST(Planner, SessionBytesPerToken) {
  auto engine = test::open_engine(fixture("flashlike"), EngineOptions{});
  const ModelConfig& c = engine->config();
  const double per_token = SessionState::bytes_per_token(c);
  EXPECT_GT(per_token, sizeof(int32_t));  // compressed layers add entries
  // 1024 is a multiple of every ratio (4, 128): no rounding between the two.
  EXPECT_EQ(double(SessionState::bytes_at(c, 2048) - SessionState::bytes_at(c, 1024)), 1024 * per_token);
  SessionState s = engine->new_session();
  const uint64_t fresh = s.used_bytes();
  std::vector<int32_t> tokens(256);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 97) + 3;
  engine->forward(s, tokens, nullptr, LogitRows::kLast);
  EXPECT_EQ(double(s.used_bytes() - fresh), 256 * per_token);
  EXPECT_LE(s.bytes(), SessionState::bytes_at(c, engine->context_limit()));
}

// The undo logs the planner reserves per session slot, against what they hold: a verify pass
// of kMaxDraftTokens + 1 rows at every alignment of the compressors' windows (the bound is
// reached exactly at the worst one), and the engine's own logs of shared passes while a
// prompt is admitted beside a session that decodes and verifies drafts.
TEST(Planner, UndoLogsPerSessionSlot) {
  constexpr int64_t kAdmitRows = 3, kVerifyRows = kMaxDraftTokens + 1;
  LoadOptions o;
  o.ram = "64G";
  o.workload.context_tokens = 1024;
  o.workload.chunk_tokens = 48;
  o.workload.sessions = 2;
  o.engine.batch_prompt_rows = kAdmitRows;
  o.engine.threads = 2;
  o.engine.batch_wait_us = 200000;  // a loaded test machine: wait long for the other member
  LoadedEngine loaded = load_engine(fixture("flashlike"), o);
  Engine& e = *loaded.engine;
  const MemoryPlan& plan = loaded.plan;
  const ModelConfig& c = e.config();
  ASSERT_EQ(plan.sessions, 2);
  const UndoLog::Size verify_most = UndoLog::most_for(c, kVerifyRows), shared_most = UndoLog::most_for(c, kAdmitRows);
  EXPECT_EQ(plan.undo_bytes, verify_most.bytes() + shared_most.bytes());
  EXPECT_LE(plan.projected_peak(), plan.budget);
  auto token = [](int64_t i) { return int32_t(i * 7 % 97) + 3; };

  // A verify pass starting at each position 112..115 covers a ratio-128 window's end and 4 or 5
  // ratio-4 window ends; starting at 115 it reaches every bound at once.
  SessionState base = e.new_session();
  std::vector<int32_t> prefix(112);
  for (size_t i = 0; i < prefix.size(); ++i) prefix[i] = token(int64_t(i));
  e.forward(base, prefix, nullptr, LogitRows::kLast);
  uint64_t most_held = 0;
  for (int64_t extra = 0; extra < 4; ++extra) {
    SessionState s = base;
    for (int64_t i = 0; i < extra; ++i) {
      const int32_t t = token(112 + i);
      e.forward(s, std::span<const int32_t>(&t, 1), nullptr, LogitRows::kLast);
    }
    std::vector<int32_t> rows(kVerifyRows);
    for (int64_t i = 0; i < kVerifyRows; ++i) rows[size_t(i)] = token(s.position + i);
    UndoLog log;
    log.reserve(verify_most);  // as the generator does
    const uint64_t reserved = log.bytes();
    log.begin(s);
    e.forward(s, rows, nullptr, LogitRows::kLast, kVerifyRows, &log);
    const UndoLog::Size held = log.size();
    EXPECT_LE(held.records, verify_most.records) << "at position " << 112 + extra;
    EXPECT_LE(held.floats, verify_most.floats) << "at position " << 112 + extra;
    EXPECT_EQ(log.bytes(), reserved) << "the log grew past its reserve at position " << 112 + extra;
    most_held = std::max(most_held, held.bytes());
  }
  EXPECT_EQ(most_held, verify_most.bytes()) << "the worst alignment reaches the bound";

  // Shared passes: a session decoding (one row, or a verify pass with its own log) beside a
  // prompt admitted in kAdmitRows-row parts; the engine logs every session's part.
  const uint64_t before = e.batch_undo_bytes();
  EXPECT_EQ(before, 0u);  // nothing shared yet
  uint64_t decoder_held = 0;
  {
    Engine::BatchMember m1 = e.join_batch(), m2 = e.join_batch();
    std::atomic<bool> decoding{false};
    std::thread decoder([&, m = std::move(m1)]() mutable {
      SessionState s = e.new_session();
      e.forward(s, std::span<const int32_t>(prefix.data(), 9), nullptr, LogitRows::kLast);
      UndoLog log;
      log.reserve(verify_most);
      for (int step = 0; step < 30; ++step) {
        const int64_t n = step % 2 == 0 ? 1 : kVerifyRows;
        std::vector<int32_t> rows(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = token(s.position + i);
        if (n == 1) {
          e.forward(s, rows, nullptr, LogitRows::kLast);
        } else {
          log.begin(s);
          e.forward(s, rows, nullptr, LogitRows::kLast, n, &log);
          decoder_held = std::max(decoder_held, log.bytes());
          log.rewind(s, s.position - n + 2);  // one draft kept
        }
        decoding.store(true);
      }
      m.leave();
    });
    std::thread admitter([&, m = std::move(m2)]() mutable {
      while (!decoding.load()) std::this_thread::yield();
      SessionState s = e.new_session();
      e.forward(s, std::span<const int32_t>(prefix.data(), 60), nullptr, LogitRows::kLast, 16);
      m.leave();
    });
    decoder.join();
    admitter.join();
  }
  const uint64_t shared = e.batch_undo_bytes();
  EXPECT_GT(shared, 0u) << "no pass was shared";
  EXPECT_LE(shared, uint64_t(plan.sessions) * shared_most.bytes());
  EXPECT_EQ(decoder_held, verify_most.bytes());  // reserved, never grown
  EXPECT_LE(shared + uint64_t(plan.sessions) * decoder_held, uint64_t(plan.sessions) * plan.undo_bytes);

  // The plan line shows them (not negligible beside this small model's session state).
  const std::string line = plan.summary();
  EXPECT_NE(line.find("undo logs " + format_bytes(plan.undo_bytes)), std::string::npos) << line;
}

// --ram on the commands that load a model: the plan line, the refusal, identical output.
TEST(Planner, RamFlagOnCommands) {
  const std::string model = fixture("tiny-a");
  auto resident = test::run_dsv4("generate -m " + model + " --tokens 496,10,20,30 -n 6 --greedy --print-ids --ram 4G");
  ASSERT_EQ(resident.exit_code, 0) << resident.err;
  EXPECT_NE(resident.err.find("experts all 48 resident"), std::string::npos) << resident.err;
  const std::string native = std::string(platform::native_read_queue_name()) == "IOCP" ? "iocp" : "uring";
  for (const std::string& io : {native, std::string("threads")}) {
    auto streamed = test::run_dsv4("generate -m " + model + " --tokens 496,10,20,30 -n 6 --greedy --print-ids --ram min --io " + io);
    ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
    EXPECT_EQ(streamed.out, resident.out);
    size_t plans = 0;
    for (size_t p = streamed.err.find("ram plan"); p != std::string::npos; p = streamed.err.find("ram plan", p + 1)) ++plans;
    EXPECT_EQ(plans, 1u) << streamed.err;
    EXPECT_NE(streamed.err.find("experts 6 of 48 slots"), std::string::npos) << streamed.err;
    EXPECT_NE(streamed.err.find("dsv4: stats: experts"), std::string::npos) << streamed.err;
  }
  auto low = test::run_dsv4("generate -m " + model + " --tokens 1,2 -n 1 --ram 8M");
  EXPECT_EQ(low.exit_code, 1);
  EXPECT_NE(low.err.find("--ram: a budget of 8.0 MiB"), std::string::npos) << low.err;
  EXPECT_NE(low.err.find("below the minimum"), std::string::npos) << low.err;
  auto bad = test::run_dsv4("score -m " + model + " --tokens-file /dev/null --logits-out /dev/null --ram lots");
  EXPECT_EQ(bad.exit_code, 2);  // refused while parsing the command line
  EXPECT_NE(bad.err.find("--ram \"lots\""), std::string::npos) << bad.err;
}

// Peak RSS of a real run stays within the budget: a synthetic checkpoint of ~400 MB run
// with a 200 MiB budget (the plan's reserve covers the process itself; no extra allowance).
TEST(ExpertStoreMemory, PeakRssWithinBudget) {
  if (kAsan) GTEST_SKIP() << "ASan's shadow memory and quarantine are not part of any budget";
  test::TempDir tmp;
  const std::string dir = tmp / "synth";
  auto synth = test::synth_budget_checkpoint(dir, 2048);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  uint64_t total = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) total += f.file_size();
  ASSERT_GT(total, 400ull << 20);
  const uint64_t budget = 200ull << 20;
  auto r = test::run_dsv4("generate -m " + dir + " --tokens 5,6,7,8,9,10,11,12 -n 4 --greedy --print-ids --ram 200M");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const double rss = test::bytes_after(r.err, "peak RSS");
  ASSERT_GT(rss, 0) << r.err;
  std::printf("peak RSS %.1f MiB with a %llu MiB budget on a %.0f MiB checkpoint\n", rss / (1 << 20),
              (unsigned long long)(budget >> 20), total / double(1 << 20));
  EXPECT_LE(rss, double(budget)) << r.err;
  EXPECT_NE(r.err.find("slots"), std::string::npos) << r.err;  // streamed, not resident
}

// Eight sessions sharing passes, streamed: the process's peak RSS stays within the plan's
// projected peak, which reserves each slot's state and undo logs (a verify pass's and its part
// of shared passes). `bench --sessions 8` on a 433 MB synthetic checkpoint at --ram 200M (the
// expert cache fills; the context is what the streams reach), and `run --batch --parallel 8`
// on the demo model at --ram min.
TEST(ExpertStoreMemory, PeakRssWithinPlanWithEightSessions) {
  if (kAsan) GTEST_SKIP() << "ASan's shadow memory and quarantine are not part of any budget";
  test::TempDir tmp;
  const std::string synth_dir = tmp / "synth";
  auto synth = test::synth_budget_checkpoint(synth_dir, 2048);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  auto bench = test::run_dsv4("bench -m " + synth_dir +
                              " --ram 200M --sessions 8 --rounds 1 --prompt-tokens 32 --gen-tokens 16 --json");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const nlohmann::json j = nlohmann::json::parse(bench.out);
  const std::string plan = j["plan"];
  EXPECT_NE(plan.find("for 8 session slots"), std::string::npos) << plan;
  EXPECT_NE(plan.find("undo logs "), std::string::npos) << plan;
  EXPECT_NE(plan.find(" slots x "), std::string::npos) << plan;  // streamed, not resident
  const double bench_projected = test::bytes_after(plan, "projected peak");
  const double bench_rss = j["peak_rss_bytes"].get<double>();
  ASSERT_GT(bench_projected, 0) << plan;
  std::printf("bench, 8 sessions: peak RSS %.1f MiB, projected peak %.1f MiB\n", bench_rss / (1 << 20),
              bench_projected / (1 << 20));
  EXPECT_LE(bench_rss, bench_projected + 0.05 * (1 << 20)) << plan;  // printed to 0.1 MiB

  const std::string in = tmp / "prompts.jsonl", out = tmp / "results.jsonl";
  std::string lines;
  for (int i = 0; i < 8; ++i)
    lines += fmt::format("{{\"prompt\":\"And it came to pass on the {} day that\",\"max_tokens\":40,\"temperature\":0}}\n",
                         i + 1);
  test::write_file(in, lines);
  auto r = test::run_dsv4("run -m models/demo --batch " + in + " --out " + out + " --parallel 8 --ctx 80 --ram min");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("for 8 session slots"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("8 prompts through 8 slots"), std::string::npos) << r.err;
  std::istringstream results(test::read_file(out));
  int answered = 0;
  for (std::string l; std::getline(results, l);) answered += nlohmann::json::parse(l)["tokens"].size() > 0;
  EXPECT_EQ(answered, 8) << r.err;
  const double projected = test::bytes_after(r.err, "projected peak"), rss = test::bytes_after(r.err, "peak RSS");
  ASSERT_GT(projected, 0) << r.err;
  ASSERT_GT(rss, 0) << r.err;  // the run --batch summary line gives it
  std::printf("run --batch, 8 slots: peak RSS %.1f MiB, projected peak %.1f MiB\n", rss / (1 << 20),
              projected / (1 << 20));
  EXPECT_LE(rss, projected + 0.05 * (1 << 20)) << r.err;
}

}  // namespace
}  // namespace dsv4
