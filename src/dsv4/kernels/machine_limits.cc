#include "dsv4/kernels/machine_limits.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
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

// Runs body(t) once on each of the pool's threads (t = 0..threads-1).
void on_every_thread(ThreadPool* pool, int threads, const std::function<void(int64_t)>& body) {
  if (!pool || threads == 1) {
    body(0);
    return;
  }
  pool->parallel_for(threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) body(t);
  });
}

}  // namespace

double measure_dram_read_gbps(ThreadPool* pool, int64_t bytes, int reps) {
  const detail::Table& t = detail::active_table();
  const int threads = pool ? pool->size() : 1;
  bytes = bytes / (64 * threads) * (64 * threads);
  void* buf = std::aligned_alloc(64, static_cast<size_t>(bytes));
  if (!buf) fail("bench: cannot allocate {} bytes for the DRAM probe", bytes);
  // Touch every page from the threads that will read it (first-touch placement), non-zero data.
  const int64_t part = bytes / threads;
  on_every_thread(pool, threads, [&](int64_t k) { std::memset(static_cast<char*>(buf) + k * part, 1, part); });
  std::vector<double> gbps;
  std::atomic<double> sink{0};
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    on_every_thread(pool, threads, [&](int64_t k) {
      double s = t.read_probe(static_cast<char*>(buf) + k * part, part);
      sink.store(s, std::memory_order_relaxed);
    });
    gbps.push_back(static_cast<double>(bytes) / (now() - t0) / 1e9);
  }
  std::free(buf);
  return median(gbps);
}

double measure_fma_gflops(ThreadPool* pool, int reps) {
  const detail::Table& t = detail::active_table();
  const int threads = pool ? pool->size() : 1;
  const int64_t iters = 2'000'000;
  std::vector<double> g;
  for (int r = 0; r < reps; ++r) {
    std::atomic<double> flops{0};
    double t0 = now();
    on_every_thread(pool, threads, [&](int64_t) {
      double f = t.fma_probe(iters);
      double cur = flops.load();
      while (!flops.compare_exchange_weak(cur, cur + f)) {
      }
    });
    g.push_back(flops.load() / (now() - t0) / 1e9);
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
