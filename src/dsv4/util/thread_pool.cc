#include "dsv4/util/thread_pool.h"

#include "dsv4/platform/platform.h"


#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DSV4_CPU_RELAX() _mm_pause()
#else
#define DSV4_CPU_RELAX() std::this_thread::yield()
#endif

namespace dsv4 {
namespace {
// Idle workers poll for 50 µs (longer than the gap between the loops of one token's forward
// pass, far shorter than a wait for an expert read or the gap between tokens), then sleep.
// Bounded by time, not by a count of polls: a count that includes sched_yield calls spun
// for ~25 ms here, and a spinning vCPU slows the VM's own disk I/O (the expert reads the
// compute thread is waiting for) by up to half.
constexpr auto kSpinTime = std::chrono::microseconds(50);
// After this many pause-polls a waiting thread yields its core instead: when the machine has
// more runnable threads than cores, the thread we wait for may need this very core, and pure
// spinning would stall it for a whole scheduler time slice on every loop.
constexpr int kPauseIterations = 1000;

inline void backoff(int i) {
  if (i < kPauseIterations) {
    DSV4_CPU_RELAX();
  } else {
    std::this_thread::yield();
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) return;
    (*body_)(begin, std::min(n_, begin + grain_));
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    bool have_job = false;
    const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    for (int i = 0;; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_relaxed)) {
        have_job = true;
        break;
      }
      if (i % 64 == 63 && std::chrono::steady_clock::now() > spin_until) break;
      backoff(i);
    }
    if (!have_job) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks();
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, Body body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    for (int64_t b = 0; b < n; b += grain) body(b, std::min(n, b + grain));
    return;
  }
  body_ = &body;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  unfinished_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // Publishing under the mutex pairs with the sleeping workers' predicate check.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_chunks();
  for (int i = 0; unfinished_.load(std::memory_order_acquire) != 0; ++i) backoff(i);
  body_ = nullptr;
}

int available_cpus() {
  return platform::cpu_count();
}

}  // namespace dsv4
