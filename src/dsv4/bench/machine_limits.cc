#include "dsv4/bench/machine_limits.h"
#include "dsv4/platform/platform.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "dsv4/kernels/kernels_internal.h"
#include "dsv4/util/error.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4::kernels {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs body(t) for t = 0..threads-1 concurrently, one dedicated thread each, and returns the
// seconds from the common start to the last finish. (The ThreadPool gives no such guarantee: a
// worker that wakes late lets the caller run both halves, which would halve the measured limit.)
double on_every_thread(int threads, const std::function<void(int64_t)>& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t)
    workers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      body(t);
    });
  while (ready.load() != threads - 1) {
  }
  double t0 = now();
  go.store(true, std::memory_order_release);
  body(0);
  for (auto& w : workers) w.join();
  return now() - t0;
}

}  // namespace

double measure_dram_read_gbps(ThreadPool* pool, int64_t bytes, int reps) {
  const detail::Table& t = detail::active_table();
  const int threads = pool ? pool->size() : 1;
  bytes = bytes / (64 * threads) * (64 * threads);
  void* buf = platform::aligned_alloc(64, static_cast<size_t>(bytes));
  if (!buf) fail("bench: cannot allocate {} bytes for the DRAM probe", bytes);
  // Touch every page from the threads that will read it (first-touch placement), non-zero data.
  const int64_t part = bytes / threads;
  on_every_thread(threads, [&](int64_t k) { std::memset(static_cast<char*>(buf) + k * part, 1, part); });
  std::vector<double> gbps;
  std::atomic<double> sink{0};
  for (int r = 0; r < reps; ++r) {
    double sec = on_every_thread(threads, [&](int64_t k) {
      double s = t.read_probe(static_cast<char*>(buf) + k * part, part);
      sink.store(s, std::memory_order_relaxed);
    });
    gbps.push_back(static_cast<double>(bytes) / sec / 1e9);
  }
  platform::aligned_free(buf);
  return median(gbps);
}

double measure_fma_gflops(ThreadPool* pool, int reps) {
  const detail::Table& t = detail::active_table();
  const int threads = pool ? pool->size() : 1;
  const int64_t iters = 2'000'000;
  std::vector<double> g;
  for (int r = 0; r < reps; ++r) {
    std::atomic<double> flops{0};
    double sec = on_every_thread(threads, [&](int64_t) {
      double f = t.fma_probe(iters);
      double cur = flops.load();
      while (!flops.compare_exchange_weak(cur, cur + f)) {
      }
    });
    g.push_back(flops.load() / sec / 1e9);
  }
  return median(g);
}

MachineLimits measure_machine_limits(ThreadPool* pool) {
  MachineLimits m;
  m.threads = pool ? pool->size() : 1;
  m.fma_gflops = measure_fma_gflops(pool);
  m.dram_read_gbps = measure_dram_read_gbps(pool);
  return m;
}

}  // namespace dsv4::kernels
