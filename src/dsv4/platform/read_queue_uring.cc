// Linux: io_uring, one I/O thread owning the ring.
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "dsv4/platform/read_queue_internal.h"
#include "dsv4/util/io_faults.h"

namespace dsv4 {
namespace {

using namespace read_queue_detail;

// ---------------------------------------------------------------------------------------
// io_uring: the I/O thread owns the ring. Submitters append to `incoming_` and poke an
// eventfd, which the ring itself reads, so the thread only ever sleeps in one place. Reads
// the fault layer fails never reach the kernel (their results wait in `synthetic_`), and
// reads it slows down wait in `parked_` until their modelled completion time.

class UringReadQueue final : public ReadQueue {
 public:
  static std::unique_ptr<UringReadQueue> create(int depth, Done done, std::shared_ptr<IoFaults> faults) {
    auto q = std::unique_ptr<UringReadQueue>(new UringReadQueue(depth, std::move(done), std::move(faults)));
    if (io_uring_queue_init(static_cast<unsigned>(std::max(8, depth * 8 + 2)), &q->ring_, 0) < 0) return nullptr;
    q->ring_ready_ = true;
    q->wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (q->wake_fd_ < 0) return nullptr;
    q->thread_ = std::thread([p = q.get()] { p->run(); });
    return q;
  }
  ~UringReadQueue() override {
    stop();
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }
  void stop() override {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    poke();
    thread_.join();
  }
  void submit(uint64_t tag, std::vector<ReadOp> ops) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
      incoming_.push_back(std::make_unique<Job>(Job{tag, std::move(ops), {}}));
    }
    poke();
  }
  const char* name() const override { return "io_uring"; }

 private:
  struct OpState {
    Job* job = nullptr;
    ReadOp* op = nullptr;
    uint64_t got = 0;
    double not_before = 0;  // fault layer's rate: completion is reported no earlier
    std::vector<iovec> iov;  // a vectored op's destinations while it is in the kernel
  };
  struct Active {
    std::unique_ptr<Job> job;
    std::vector<OpState> ops;
    size_t remaining = 0;
  };
  struct Result {
    OpState* op;
    int res;
  };

  UringReadQueue(int depth, Done done, std::shared_ptr<IoFaults> faults)
      : depth_(depth), done_(std::move(done)), faults_(std::move(faults)) {}

  void poke() {
    uint64_t one = 1;
    ssize_t n;
    do {
      n = ::write(wake_fd_, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
  }

  io_uring_sqe* get_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe) {  // ring full: push what is queued to the kernel and retry
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void queue_read(OpState* s) {
    const ReadOp& op = *s->op;
    const IoFaults::Action a = consult_faults(faults_.get(), *op.path, op.offset + s->got, op.length - s->got);
    ++s->job->outcome.requests;
    ++in_flight_ops_;
    s->not_before = a.not_before;
    if (a.error || a.eof) {
      synthetic_.push_back({s, a.error ? -a.error : 0});
      return;
    }
    io_uring_sqe* sqe = get_sqe();
    if (op.spans.empty()) {
      io_uring_prep_read(sqe, op.fd, op.dst + s->got, static_cast<unsigned>(a.length), op.offset + s->got);
    } else {
      // One request into several destinations; the iovecs live with the op until it completes.
      platform::IoSpan spans[platform::kMaxIoSpans];
      const int count = spans_at(op, s->got, a.length, spans);
      s->iov.resize(static_cast<size_t>(count));
      for (int i = 0; i < count; ++i) s->iov[i] = {spans[i].dst, static_cast<size_t>(spans[i].length)};
      io_uring_prep_readv(sqe, op.fd, s->iov.data(), static_cast<unsigned>(count), op.offset + s->got);
    }
    io_uring_sqe_set_data(sqe, s);
  }

  void arm_wake() {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data(sqe, nullptr);
    wake_armed_ = true;
  }

  void handle(std::list<Active>& active, OpState* s, int res) {
    --in_flight_ops_;
    if (!account_read(*s->op, *s->job, s->got, res)) {
      queue_read(s);
      return;
    }
    for (auto it = active.begin(); it != active.end(); ++it) {
      if (it->job.get() == s->job) {
        if (--it->remaining == 0) finish(active, it);
        break;
      }
    }
  }

  // Submits what is queued and waits for at least one completion, or less when results
  // are already waiting (synthetic) or a parked read's time comes first.
  void submit_and_wait() {
    if (!synthetic_.empty()) {
      io_uring_submit(&ring_);
      return;
    }
    if (parked_.empty()) {
      io_uring_submit_and_wait(&ring_, 1);
      return;
    }
    double first = parked_.front().op->not_before;
    for (const Result& r : parked_) first = std::min(first, r.op->not_before);
    const double wait = std::max(0.0, first - IoFaults::now());
    __kernel_timespec ts;
    ts.tv_sec = static_cast<int64_t>(wait);
    ts.tv_nsec = static_cast<int64_t>((wait - double(ts.tv_sec)) * 1e9);
    io_uring_cqe* cqe = nullptr;
    io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
  }

  void run() {
    std::list<Active> active;
    for (;;) {
      bool stopping;
      std::deque<std::unique_ptr<Job>> fresh;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping = stop_;
        while (!stopping && !incoming_.empty() && static_cast<int>(active.size() + fresh.size()) < depth_) {
          fresh.push_back(std::move(incoming_.front()));
          incoming_.pop_front();
        }
      }
      if (stopping && in_flight_ops_ == 0) return;
      for (auto& job : fresh) {
        active.push_back(Active{std::move(job), {}, 0});
        Active& a = active.back();
        a.ops.resize(a.job->ops.size());
        a.remaining = a.ops.size();
        for (size_t i = 0; i < a.ops.size(); ++i) {
          a.ops[i] = OpState{a.job.get(), &a.job->ops[i], 0, 0, {}};
          queue_read(&a.ops[i]);
        }
        if (a.remaining == 0) finish(active, std::prev(active.end()));
      }
      if (!wake_armed_ && !stopping) arm_wake();
      submit_and_wait();
      io_uring_cqe* cqe;
      std::vector<Result> done;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
        auto* s = static_cast<OpState*>(io_uring_cqe_get_data(cqe));
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        if (!s) {
          wake_armed_ = false;
          continue;
        }
        if (s->not_before > 0) {
          parked_.push_back({s, res});
        } else {
          done.push_back({s, res});
        }
      }
      const double now = parked_.empty() ? 0 : IoFaults::now();
      for (size_t i = 0; i < parked_.size();) {
        if (parked_[i].op->not_before <= now) {
          done.push_back(parked_[i]);
          parked_[i] = parked_.back();
          parked_.pop_back();
        } else {
          ++i;
        }
      }
      done.insert(done.end(), synthetic_.begin(), synthetic_.end());
      synthetic_.clear();
      for (const Result& r : done) handle(active, r.op, r.res);
    }
  }

  void finish(std::list<Active>& active, std::list<Active>::iterator it) {
    std::unique_ptr<Job> job = std::move(it->job);
    active.erase(it);
    done_(job->tag, job->outcome);
  }

  const int depth_;
  Done done_;
  std::shared_ptr<IoFaults> faults_;
  io_uring ring_{};
  bool ring_ready_ = false;
  int wake_fd_ = -1;
  uint64_t wake_value_ = 0;
  bool wake_armed_ = false;
  int in_flight_ops_ = 0;  // reads in the kernel, parked or with a synthetic result
  std::vector<Result> synthetic_, parked_;
  std::thread thread_;
  std::mutex mutex_;
  std::deque<std::unique_ptr<Job>> incoming_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<ReadQueue> make_native_read_queue(int depth, ReadQueue::Done done, std::shared_ptr<IoFaults> faults) {
  return UringReadQueue::create(depth, std::move(done), std::move(faults));
}

}  // namespace dsv4
