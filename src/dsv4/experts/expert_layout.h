// Where each routed expert's bytes are in the checkpoint and how to read them with
// O_DIRECT. The six parts of an expert (w1/w3/w2 weight + scale) may sit anywhere, even in
// different shards; parts that are close together in one shard are read as one window.
// Every window starts and ends on a 4 KiB boundary and lands 4 KiB-aligned in the slot,
// so a part's data ends up at (slot + window.slot_offset + part.offset - window.file_offset).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsv4 {

class Checkpoint;

struct ReadWindow {
  int shard = 0;             // index into ExpertLayout::shard_paths
  uint64_t file_offset = 0;  // 4 KiB aligned
  uint64_t length = 0;       // 4 KiB multiple (may run past the end of the file)
  uint64_t needed = 0;       // bytes from file_offset that must be read (the rest is slack)
  uint64_t slot_offset = 0;  // 4 KiB aligned destination inside the slot
};

struct ExpertReadPlan {
  std::vector<ReadWindow> windows;
  uint64_t part_offsets[6] = {};  // each part's position in the slot (ExpertLocation order)
  uint64_t slot_bytes = 0;        // bytes of slot this expert occupies
  uint64_t read_bytes = 0;        // bytes the windows read
  uint64_t payload_bytes = 0;     // the six parts' own bytes
};

class ExpertLayout {
 public:
  // Plans every (layer, expert) of every layer in the config (main + MTP).
  explicit ExpertLayout(const Checkpoint& ck);

  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }
  const ExpertReadPlan& plan(int layer, int expert) const {
    return plans_[static_cast<size_t>(layer) * n_experts_ + expert];
  }
  // The largest slot any expert needs: every cache slot has this size.
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Bytes the resident provider holds per expert (payload rounded per part).
  uint64_t max_payload_bytes() const { return max_payload_; }
  // The most windows any expert is read in (1 contiguous, 2 official, more where one straddles).
  int max_windows() const { return max_windows_; }

  // Neighbours in the file: the expert of the same layer whose small window (under
  // kMergeWindowBytes: the scales, in the official layout) begins where this one's ends
  // (sharing one 4 KiB page at most), so both can be read as one request. -1: none.
  int next_in_file(int layer, int expert) const { return next_[static_cast<size_t>(layer) * n_experts_ + expert]; }
  int previous_in_file(int layer, int expert) const {
    return previous_[static_cast<size_t>(layer) * n_experts_ + expert];
  }
  // The index of that small window in plan(layer, expert).windows (-1: it has none).
  int small_window(int layer, int expert) const { return small_[static_cast<size_t>(layer) * n_experts_ + expert]; }

 private:
  void link_neighbours();

  int n_layers_ = 0, n_experts_ = 0;
  std::vector<std::string> shard_paths_;
  std::vector<ExpertReadPlan> plans_;
  uint64_t slot_bytes_ = 0, max_payload_ = 0;
  int max_windows_ = 1;
  std::vector<int> next_, previous_, small_;  // per (layer, expert), see next_in_file
};

// How the main layers' routed experts lie in the files: how many byte ranges each expert's
// six parts form (parts that touch are one range; 1 in the contiguous layout, 2 in the
// official one: weights, then scales) and how many experts have parts in two shards.
struct ExpertRangeCensus {
  std::map<int, int64_t> experts_by_ranges;  // ranges -> experts with that many
  int64_t straddling = 0;
  int64_t experts = 0;
};
ExpertRangeCensus census_expert_ranges(const Checkpoint& ck);

// Parts of one shard closer than this are read in one window (reading the gap is cheaper
// than a second request).
inline constexpr uint64_t kCoalesceGapBytes = 64 << 10;

// Windows up to this size are worth merging with a neighbour's into one request: for them the
// cost of a request is a visible share of the read. Larger ones (an expert's 12 MB of weights)
// stay separate requests, which keeps the drive's queue deep.
inline constexpr uint64_t kMergeWindowBytes = 2 << 20;

}  // namespace dsv4
