// Asynchronous reads of expert windows into cache slots, with a few requests in flight.
// Two implementations: the OS's own (io_uring on Linux, one I/O thread owning the ring; an
// I/O completion port on Windows) and a small pool of pread threads (macOS, and the fallback
// where the native one cannot be set up). Completions are reported through
// a callback on the queue's own thread; the callback may submit more work. Both consult an
// optional fault layer (util/io_faults.h) before every read syscall.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/platform/platform.h"

namespace dsv4 {

class IoFaults;

struct ReadOp {
  int fd = -1;           // descriptor to read (O_DIRECT when the filesystem allows it)
  int buffered_fd = -1;  // fallback if the kernel refuses the direct read (EINVAL)
  int shard = 0;         // the caller's file id (reported back on failure and O_DIRECT refusal)
  const std::string* path = nullptr;
  uint64_t offset = 0;   // aligned for O_DIRECT
  uint64_t length = 0;   // aligned; may run past the end of the file
  uint64_t needed = 0;   // the read is complete once this many bytes arrived
  uint8_t* dst = nullptr;
  // Several destinations, in order (their lengths add up to `length`; at most
  // platform::kMaxIoSpans): one request that lands in several places, e.g. the scales of
  // neighbouring experts, which sit end to end in the file, into their own slots. Empty: dst.
  std::vector<platform::IoSpan> spans;
};

struct ReadOutcome {
  std::string error;                 // empty on success; else one line naming the file
  int failed_shard = -1;             // ReadOp::shard of the op that failed
  std::vector<int> refused_direct;   // shards whose O_DIRECT read was refused (fell back)
  uint32_t requests = 0;             // read syscalls / io_uring reads the job took
};

class ReadQueue {
 public:
  using Done = std::function<void(uint64_t tag, const ReadOutcome& outcome)>;
  virtual ~ReadQueue() = default;
  // Queues a job (all its ops); `done` runs once every op finished. Never blocks on I/O.
  virtual void submit(uint64_t tag, std::vector<ReadOp> ops) = 0;
  // Waits for the reads in flight, drops queued jobs and joins the queue's threads. Jobs
  // submitted afterwards (e.g. from a completion callback) are ignored. Idempotent; the
  // destructor calls it.
  virtual void stop() = 0;
  virtual const char* name() const = 0;
};

// The OS's queue (platform::native_read_queue_name()) with up to `depth` jobs in flight; null
// if there is none or it cannot be set up here.
std::unique_ptr<ReadQueue> make_native_read_queue(int depth, ReadQueue::Done done,
                                                 std::shared_ptr<IoFaults> faults = nullptr);
// `threads` pread workers, one job each at a time.
std::unique_ptr<ReadQueue> make_thread_read_queue(int threads, ReadQueue::Done done,
                                                  std::shared_ptr<IoFaults> faults = nullptr);

}  // namespace dsv4
