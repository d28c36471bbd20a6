// The portable read queue: a few pread workers, each taking one op at a time.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "dsv4/platform/platform.h"
#include "dsv4/platform/read_queue_internal.h"
#include "dsv4/util/io_faults.h"

namespace dsv4 {
namespace {

using namespace read_queue_detail;

// ---------------------------------------------------------------------------------------
// pread workers. The ops of one job (an expert's pieces, which may lie in different folders)
// are taken by different workers, so they are read at the same time as with io_uring.

class ThreadReadQueue final : public ReadQueue {
 public:
  ThreadReadQueue(int threads, Done done, std::shared_ptr<IoFaults> faults)
      : done_(std::move(done)), faults_(std::move(faults)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ThreadReadQueue() override { stop(); }
  void stop() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
  }
  void submit(uint64_t tag, std::vector<ReadOp> ops) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
      auto job = std::make_shared<Pending>();
      job->job = Job{tag, std::move(ops), {}};
      job->remaining = job->job.ops.size();
      if (job->remaining == 0) queue_.push_back(Task{job, kNoOp});  // nothing to read: reported at once
      for (size_t i = 0; i < job->job.ops.size(); ++i) queue_.push_back(Task{job, i});
    }
    wake_.notify_all();
  }
  const char* name() const override { return "threads"; }

 private:
  struct Pending {
    Job job;
    size_t remaining = 0;  // ops not yet finished (guarded by mutex_)
  };
  static constexpr size_t kNoOp = ~size_t{0};
  struct Task {
    std::shared_ptr<Pending> job;
    size_t op = kNoOp;
  };

  void work() {
    for (;;) {
      Task task;
      bool skip = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;  // queued jobs are dropped: their owner is going away
        task = std::move(queue_.front());
        queue_.pop_front();
        skip = !task.job->job.outcome.error.empty();  // another op of the job failed: its read is lost anyway
      }
      Job& job = task.job->job;
      bool last = true;
      if (task.op != kNoOp) {
        ReadOutcome mine;
        if (!skip) read_op(mine, job.ops[task.op]);
        std::lock_guard<std::mutex> lock(mutex_);
        ReadOutcome& all = job.outcome;
        all.requests += mine.requests;
        for (int shard : mine.refused_direct) note_refused(all, shard);
        if (all.error.empty() && !mine.error.empty()) {
          all.error = std::move(mine.error);
          all.failed_shard = mine.failed_shard;
        }
        last = --task.job->remaining == 0;
      }
      // The last op's worker reports the job (every other op's outcome was merged under the lock).
      if (last) done_(job.tag, job.outcome);
    }
  }

  void read_op(ReadOutcome& outcome, ReadOp& op) {
    uint64_t got = 0;
    platform::advise_read(op.fd, op.offset, op.needed);
    while (got < op.needed) {
      const uint64_t at = op.offset + got;
      ++outcome.requests;
      int64_t n;
      if (op.spans.empty()) {
        n = faulty_pread(faults_.get(), *op.path, op.fd, op.dst + got, op.length - got, at);
      } else {
        platform::IoSpan spans[platform::kMaxIoSpans];
        const int count = spans_at(op, got, op.length - got, spans);
        n = faulty_preadv(faults_.get(), *op.path, op.fd, spans, count, at);
      }
      const int err = n < 0 ? errno : 0;
      if (n < 0 && err == EINTR) continue;
      if (n < 0 && err == EINVAL && op.fd != op.buffered_fd) {
        op.fd = op.buffered_fd;  // the kernel refused O_DIRECT here: read through the page cache
        note_refused(outcome, op.shard);
        continue;
      }
      if (n < 0) {
        outcome.error = read_error(op, at, err);
        outcome.failed_shard = op.shard;
        return;
      }
      if (n == 0) {
        outcome.error = eof_error(op, at);
        outcome.failed_shard = op.shard;
        return;
      }
      got += static_cast<uint64_t>(n);
    }
  }

  Done done_;
  std::shared_ptr<IoFaults> faults_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<ReadQueue> make_thread_read_queue(int threads, ReadQueue::Done done,
                                                  std::shared_ptr<IoFaults> faults) {
  return std::make_unique<ThreadReadQueue>(threads, std::move(done), std::move(faults));
}

}  // namespace dsv4
