// What the read queues share: a job's bookkeeping and its error lines.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "dsv4/platform/read_queue.h"

namespace dsv4::read_queue_detail {

struct Job {
  uint64_t tag = 0;
  std::vector<ReadOp> ops;
  ReadOutcome outcome;
};

inline std::string read_error(const ReadOp& op, uint64_t at, int err) {
  return fmt::format("{}: expert read of {} bytes at offset {} failed: {}", *op.path, op.length, at,
                     std::strerror(err));
}

inline std::string eof_error(const ReadOp& op, uint64_t at) {
  return fmt::format("{}: unexpected end of file at offset {} while reading an expert (file truncated?)", *op.path,
                     at);
}

inline void note_refused(ReadOutcome& outcome, int shard) {
  for (int s : outcome.refused_direct)
    if (s == shard) return;
  outcome.refused_direct.push_back(shard);
}

// Where byte `at` of `op` goes, and how many bytes from there on are contiguous in memory.
inline platform::IoSpan destination(const ReadOp& op, uint64_t at) {
  if (op.spans.empty()) return {op.dst + at, op.length - at};
  for (const platform::IoSpan& s : op.spans) {
    if (at < s.length) return {s.dst + at, s.length - at};
    at -= s.length;
  }
  return {nullptr, 0};
}

// The destinations of bytes [at, at + length) of `op`, in `out` (room for kMaxIoSpans);
// returns how many.
inline int spans_at(const ReadOp& op, uint64_t at, uint64_t length, platform::IoSpan* out) {
  if (op.spans.empty()) {
    out[0] = {op.dst + at, length};
    return 1;
  }
  int n = 0;
  for (const platform::IoSpan& s : op.spans) {
    if (length == 0 || n == platform::kMaxIoSpans) break;
    if (at >= s.length) {
      at -= s.length;
      continue;
    }
    const uint64_t take = std::min(s.length - at, length);
    out[n++] = {s.dst + at, take};
    length -= take;
    at = 0;
  }
  return n;
}

// One finished read of `op` (job `job`, `got` bytes of it so far) that returned `res` (bytes,
// or -errno) in an asynchronous queue; returns true when the op is complete, false when it must
// be read again from `got` (interrupted, or the volume refused the unbuffered read: it then
// reads through the cache).
inline bool account_read(ReadOp& op, Job& job, uint64_t& got, int res) {
  if (res == -EINTR || res == -EAGAIN) return false;
  if (res == -EINVAL && op.fd != op.buffered_fd) {
    op.fd = op.buffered_fd;
    note_refused(job.outcome, op.shard);
    return false;
  }
  if (res < 0) {
    if (job.outcome.error.empty()) {
      job.outcome.error = read_error(op, op.offset + got, -res);
      job.outcome.failed_shard = op.shard;
    }
    return true;
  }
  if (res == 0) {
    if (got < op.needed && job.outcome.error.empty()) {
      job.outcome.error = eof_error(op, op.offset + got);
      job.outcome.failed_shard = op.shard;
    }
    return true;
  }
  got += static_cast<uint64_t>(res);
  return got >= op.needed;  // the slack after `needed` may lie past the end of the file
}

}  // namespace dsv4::read_queue_detail
