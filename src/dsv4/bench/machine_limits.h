// The machine's own limits, measured in the same run as a benchmark so that kernel numbers can
// be read as a fraction of what this (possibly shared, noisy) machine delivers right now.
#pragma once

#include <cstdint>

namespace dsv4 {
class ThreadPool;
}

namespace dsv4::kernels {

struct MachineLimits {
  double dram_read_gbps = 0;  // vectorized sum over a buffer far larger than the caches
  double fma_gflops = 0;      // independent FP32 FMA chains on every thread, active path's width
  int threads = 1;
};

// Median of `reps` timed passes over a `bytes`-byte buffer (allocated, filled and freed here),
// split evenly over as many threads as the pool has (dedicated threads started together, so the
// probe really runs them concurrently).
double measure_dram_read_gbps(ThreadPool* pool, int64_t bytes = int64_t{512} << 20, int reps = 5);

// Median of `reps` runs of the active path's FMA probe on pool->size() concurrent threads.
double measure_fma_gflops(ThreadPool* pool, int reps = 5);

MachineLimits measure_machine_limits(ThreadPool* pool);

}  // namespace dsv4::kernels
