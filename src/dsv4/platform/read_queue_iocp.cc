// Windows: reads in flight through an I/O completion port, one I/O thread waiting on it.
// Each descriptor an op names is reopened once per queue (ReOpenFile) with
// FILE_FLAG_OVERLAPPED (and NO_BUFFERING when the op's descriptor is the unbuffered one) and
// tied to this queue's port: a handle can belong to one port only, and the descriptors the
// callers hold stay usable for plain preads. Reads the fault layer fails never reach the OS
// (their results wait in `synthetic_`); reads it slows down wait in `parked_`.
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "dsv4/platform/read_queue_internal.h"
#include "dsv4/platform/windows_util.h"
#include "dsv4/util/io_faults.h"

namespace dsv4 {
namespace {

using namespace read_queue_detail;

constexpr ULONG_PTR kWakeKey = 1, kReadKey = 2;

class IocpReadQueue final : public ReadQueue {
 public:
  static std::unique_ptr<IocpReadQueue> create(int depth, Done done, std::shared_ptr<IoFaults> faults) {
    auto q = std::unique_ptr<IocpReadQueue>(new IocpReadQueue(depth, std::move(done), std::move(faults)));
    q->port_ = CreateIoCompletionPort(INVALID_HANDLE_VALUE, nullptr, 0, 1);
    if (!q->port_) return nullptr;
    q->thread_ = std::thread([p = q.get()] { p->run(); });
    return q;
  }
  ~IocpReadQueue() override {
    stop();
    for (auto& [key, h] : handles_) CloseHandle(h.own);
    if (port_) CloseHandle(port_);
  }
  void stop() override {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    PostQueuedCompletionStatus(port_, 0, kWakeKey, nullptr);
    thread_.join();
  }
  void submit(uint64_t tag, std::vector<ReadOp> ops) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
      incoming_.push_back(std::make_unique<Job>(Job{tag, std::move(ops), {}}));
    }
    PostQueuedCompletionStatus(port_, 0, kWakeKey, nullptr);
  }
  const char* name() const override { return "IOCP"; }

 private:
  struct OpState {
    OVERLAPPED ov{};  // first: the completion's OVERLAPPED* is the OpState*
    Job* job = nullptr;
    ReadOp* op = nullptr;
    uint64_t got = 0;
    double not_before = 0;
  };
  struct Active {
    std::unique_ptr<Job> job;
    std::vector<OpState> ops;
    size_t remaining = 0;
  };
  struct Result {
    OpState* op;
    int res;  // bytes, or -errno
  };
  struct OwnHandle {
    HANDLE source = INVALID_HANDLE_VALUE;  // the caller's HANDLE it was reopened from
    HANDLE own = INVALID_HANDLE_VALUE;
  };

  IocpReadQueue(int depth, Done done, std::shared_ptr<IoFaults> faults)
      : depth_(depth), done_(std::move(done)), faults_(std::move(faults)) {}

  // This queue's overlapped handle for `fd` (unbuffered: whether fd is the op's direct one).
  HANDLE own_handle(int fd, bool unbuffered) {
    const HANDLE source = platform::handle_of(fd);
    OwnHandle& h = handles_[{fd, unbuffered}];
    if (h.source == source && h.own != INVALID_HANDLE_VALUE) return h.own;
    if (h.own != INVALID_HANDLE_VALUE) CloseHandle(h.own);  // the descriptor now names another file
    h.source = source;
    h.own = ReOpenFile(source, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                       FILE_FLAG_OVERLAPPED | (unbuffered ? FILE_FLAG_NO_BUFFERING : 0));
    if (h.own != INVALID_HANDLE_VALUE && !CreateIoCompletionPort(h.own, port_, kReadKey, 0)) {
      CloseHandle(h.own);
      h.own = INVALID_HANDLE_VALUE;
    }
    return h.own;
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
    const HANDLE h = own_handle(op.fd, op.fd != op.buffered_fd);
    if (h == INVALID_HANDLE_VALUE) {
      synthetic_.push_back({s, -platform::errno_from(GetLastError())});
      return;
    }
    const uint64_t at = op.offset + s->got;
    s->ov = OVERLAPPED{};
    s->ov.Offset = static_cast<DWORD>(at);
    s->ov.OffsetHigh = static_cast<DWORD>(at >> 32);
    // A vectored op is read span by span (each ReadFile lands in one place).
    const platform::IoSpan to = destination(op, s->got);
    if (!ReadFile(h, to.dst, static_cast<DWORD>(std::min(a.length, to.length)), nullptr, &s->ov)) {
      const DWORD e = GetLastError();
      if (e != ERROR_IO_PENDING) synthetic_.push_back({s, e == ERROR_HANDLE_EOF ? 0 : -platform::errno_from(e)});
    }
    // Success now or later: the port gets the completion either way.
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

  DWORD wait_ms() const {
    if (!synthetic_.empty()) return 0;
    if (parked_.empty()) return INFINITE;
    double first = parked_.front().op->not_before;
    for (const Result& r : parked_) first = std::min(first, r.op->not_before);
    const double wait = std::max(0.0, first - IoFaults::now());
    return static_cast<DWORD>(wait * 1000.0) + 1;
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
          a.ops[i].job = a.job.get();
          a.ops[i].op = &a.job->ops[i];
          queue_read(&a.ops[i]);
        }
        if (a.remaining == 0) finish(active, std::prev(active.end()));
      }
      std::vector<Result> done;
      // Every completion the port has now (waiting for the first one).
      for (DWORD wait = wait_ms();; wait = 0) {
        DWORD bytes = 0;
        ULONG_PTR key = 0;
        OVERLAPPED* ov = nullptr;
        const BOOL ok = GetQueuedCompletionStatus(port_, &bytes, &key, &ov, wait);
        if (!ov) break;  // a wake-up post, or the wait timed out
        auto* s = reinterpret_cast<OpState*>(ov);
        int res = static_cast<int>(bytes);
        if (!ok) {
          const DWORD e = GetLastError();
          res = e == ERROR_HANDLE_EOF ? 0 : -platform::errno_from(e);
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
  HANDLE port_ = nullptr;
  std::map<std::pair<int, bool>, OwnHandle> handles_;  // I/O thread only
  int in_flight_ops_ = 0;  // reads with the OS, parked or with a synthetic result
  std::vector<Result> synthetic_, parked_;
  std::thread thread_;
  std::mutex mutex_;
  std::deque<std::unique_ptr<Job>> incoming_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<ReadQueue> make_native_read_queue(int depth, ReadQueue::Done done, std::shared_ptr<IoFaults> faults) {
  return IocpReadQueue::create(depth, std::move(done), std::move(faults));
}

}  // namespace dsv4
