// What the read queues share: a job's bookkeeping and its error lines.
#pragma once

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

}  // namespace dsv4::read_queue_detail
