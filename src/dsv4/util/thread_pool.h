// A small persistent thread pool for data-parallel loops. The calling thread takes part.
// Decode issues hundreds of small loops per token, so idle workers spin briefly before
// sleeping: a wake-up through a condition variable alone costs tens of microseconds.
//
// Determinism rule for users: a task must compute its outputs completely by itself (no
// cross-task reductions), so results never depend on how many threads ran or which
// thread took which range.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "dsv4/util/function_ref.h"

namespace dsv4 {

class ThreadPool {
 public:
  // n_threads counts the caller; 1 means everything runs inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  using Body = FunctionRef<void(int64_t, int64_t)>;
  // Calls body(begin, end) over [0, n) split into chunks [k*grain, min(n, (k+1)*grain)).
  // Not reentrant: body must not call parallel_for on the same pool. Never allocates.
  void parallel_for(int64_t n, int64_t grain, Body body);

 private:
  void worker_loop();
  void run_chunks();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> unfinished_{0};  // workers still inside the current job
  std::atomic<bool> stop_{false};
  // Current job.
  const Body* body_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
};

// Hardware threads available to this process (sched affinity aware).
int available_cpus();

}  // namespace dsv4
