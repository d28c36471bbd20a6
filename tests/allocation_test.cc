// Steady-state decode and prefill make no heap allocation: every activation lives in the
// engine's forward workspace and the session reserves its growing state up front. This file
// replaces the global operator new for the whole test binary with one that counts calls while
// a test asks it to (any thread: the pool's workers count too).
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cstdlib>
#include <new>
#include <thread>

#include "dsv4/io/checkpoint.h"
#include "dsv4/model/engine.h"
#include "dsv4/model/undo_log.h"
#include "dsv4/runtime/model_loader.h"
#include "test_util.h"

// GCC sees operator new inlined as malloc and our operator delete as free and warns of a
// mismatch; they are a matched pair by construction.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocations{0};

void* counted(size_t n, size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align) : std::malloc(n);
  return p;
}
}  // namespace

void* operator new(size_t n) {
  if (void* p = counted(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  if (void* p = counted(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, std::align_val_t a) {
  if (void* p = counted(n, static_cast<size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) {
  if (void* p = counted(n, static_cast<size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace dsv4 {
namespace {

// Heap allocations made while `body` runs.
template <typename F>
uint64_t allocations_during(F&& body) {
  g_allocations.store(0);
  g_counting.store(true);
  body();
  g_counting.store(false);
  return g_allocations.load();
}

struct Case {
  std::string fixture;
  kernels::Numerics numerics;
  bool streamed;  // the SSD expert store at --ram min instead of resident experts (see below)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.fixture << (c.numerics == kernels::Numerics::kFast ? " fast" : " reference")
      << (c.streamed ? " streamed" : " resident");
}

class SteadyState : public ::testing::TestWithParam<Case> {};

TEST_P(SteadyState, PrefillAndDecodeDoNotAllocate) {
  const Case& c = GetParam();
  LoadOptions o;
  o.engine.numerics = c.numerics;
  o.engine.threads = 2;  // the parallel paths, with their per-chunk scratch
  o.workload.context_tokens = 512;
  o.workload.chunk_tokens = 64;
  o.ram = c.streamed ? "min" : "4G";
  o.mtp = MtpLoad::kYes;
  LoadedEngine loaded = load_engine(test::fixture(c.fixture), o);
  ASSERT_EQ(loaded.plan.all_resident, !c.streamed);
  Engine& engine = *loaded.engine;
  const int64_t V = engine.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % V);

  SessionState s = engine.new_session();
  engine.forward(s, std::span<const int32_t>(prompt).first(100), logits.data(), LogitRows::kLast);  // warm-up
  int32_t next = 1;
  engine.forward(s, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);

  const uint64_t prefill = allocations_during([&] {
    engine.forward(s, std::span<const int32_t>(prompt).subspan(100), logits.data(), LogitRows::kLast);
  });
  EXPECT_EQ(prefill, 0u) << "a 100-token prefill (two passes) allocated";
  const uint64_t decode = allocations_during([&] {
    for (int i = 0; i < 40; ++i) {
      next = static_cast<int32_t>((next * 31 + 7) % V);
      engine.forward(s, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
    }
  });
  EXPECT_EQ(decode, 0u) << "40 decode steps allocated";
  // Speculative steps: MTP drafts (catch-up and chained), a verify pass of 4 rows with its
  // undo log, and the rewind (the log keeps its capacity from the warm-up step).
  ASSERT_TRUE(engine.has_mtp());
  std::vector<float> rows_logits(static_cast<size_t>(4 * V));
  UndoLog undo;
  int32_t rows[4];
  auto spec_step = [&] {
    rows[0] = next;
    engine.mtp_draft(s, rows[0], 3, rows + 1);
    undo.begin(s);
    const int64_t at = s.position;
    engine.forward(s, std::span<const int32_t>(rows, 4), rows_logits.data(), LogitRows::kAll, 4, &undo);
    undo.rewind(s, at + 1 + (next % 3));
    next = static_cast<int32_t>((next * 31 + 7) % V);
  };
  for (int i = 0; i < 3; ++i) spec_step();  // warm-up
  const uint64_t speculative = allocations_during([&] {
    for (int i = 0; i < 20; ++i) spec_step();
  });
  EXPECT_EQ(speculative, 0u) << "20 speculative steps allocated";
  // The counter itself works: a vector allocates.
  EXPECT_GT(allocations_during([] { std::vector<int> v(1000); }), 0u);
}

// Batched decode: one pass over four sessions' rows (forward_batch), a pass of decode rows
// beside a prompt chunk, and four threads sharing passes through the batch queue (its undo
// logs keep their capacity from the warm-up steps).
TEST_P(SteadyState, BatchedDecodeDoesNotAllocate) {
  const Case& c = GetParam();
  LoadOptions o;
  o.engine.numerics = c.numerics;
  o.engine.threads = 2;
  o.engine.batch_wait_us = 100000;
  o.workload.context_tokens = 512;
  o.workload.chunk_tokens = 64;
  o.ram = "4G";
  LoadedEngine loaded = load_engine(test::fixture(c.fixture), o);
  Engine& engine = *loaded.engine;
  const int64_t V = engine.config().vocab_size;
  constexpr int kSessions = 4;
  std::vector<SessionState> sessions;
  std::vector<std::vector<float>> logits(kSessions, std::vector<float>(static_cast<size_t>(V)));
  std::vector<int32_t> prompt(120);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % V);
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(engine.new_session());
    engine.forward(sessions.back(), std::span<const int32_t>(prompt).first(20 + i), logits[i].data(), LogitRows::kLast);
  }
  int32_t next[kSessions] = {1, 2, 3, 4};
  std::vector<BatchItem> items(kSessions);
  auto step = [&](int with_chunk_from) {
    for (int i = 0; i < kSessions; ++i) {
      next[i] = static_cast<int32_t>((next[i] * 31 + 7 + i) % V);
      items[i] = BatchItem{&sessions[i], std::span<const int32_t>(&next[i], 1), logits[i].data(), LogitRows::kLast};
    }
    if (with_chunk_from >= 0)
      items[0].tokens = std::span<const int32_t>(prompt).subspan(static_cast<size_t>(with_chunk_from), 16);
    engine.forward_batch(items);
  };
  step(-1);
  step(20);  // warm-up
  EXPECT_EQ(allocations_during([&] {
              for (int i = 0; i < 20; ++i) step(i % 4 == 0 ? 40 + i : -1);
            }),
            0u)
      << "20 batched passes allocated";

  // The members settle at different times, as a server's slots do: the first thread warms
  // up while the others wait (joined), then the others without it. So no pass of the warm-up
  // carries all four, and the first that does comes in the counted steps: what it needs must
  // have been reserved when its members joined.
  std::barrier sync(kSessions + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i)
    threads.emplace_back([&, i] {
      Engine::BatchMember member = engine.join_batch();
      int32_t token = next[i];
      auto decode = [&] {
        token = static_cast<int32_t>((token * 31 + 7 + i) % V);
        engine.forward(sessions[i], std::span<const int32_t>(&token, 1), logits[i].data(), LogitRows::kLast);
      };
      sync.arrive_and_wait();  // every member has joined
      if (i == 0)
        for (int k = 0; k < 3; ++k) decode();
      sync.arrive_and_wait();
      if (i != 0)
        for (int k = 0; k < 3; ++k) decode();
      sync.arrive_and_wait();
      for (int k = 0; k < 20; ++k) decode();
      sync.arrive_and_wait();
    });
  for (int phase = 0; phase < 3; ++phase) sync.arrive_and_wait();
  const Engine::PassCounts before = engine.pass_counts();
  g_allocations.store(0);
  g_counting.store(true);
  sync.arrive_and_wait();
  g_counting.store(false);
  const Engine::PassCounts after = engine.pass_counts();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(g_allocations.load(), 0u) << "4 threads' 20 decode steps through the batch queue allocated";
  EXPECT_GT(after.parts - before.parts, after.passes - before.passes) << "no pass was shared";
}

INSTANTIATE_TEST_SUITE_P(Engines, SteadyState,
                         ::testing::Values(Case{"tiny-a", kernels::Numerics::kFast, false},
                                           Case{"tiny-a", kernels::Numerics::kReference, false},
                                           Case{"flashlike", kernels::Numerics::kFast, false},
                                           Case{"flashlike", kernels::Numerics::kReference, false}));
// Not yet with the SSD expert store: its read bookkeeping (a job and its ReadOps per expert
// read) still allocates per read; the forward pass around it does not.

}  // namespace
}  // namespace dsv4
