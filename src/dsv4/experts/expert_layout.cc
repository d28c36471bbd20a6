#include "dsv4/experts/expert_layout.h"

#include <algorithm>
#include <map>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/util/file.h"

namespace dsv4 {

ExpertLayout::ExpertLayout(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  n_layers_ = c.num_layers;  // main layers: nothing runs the MTP layer's experts yet
  n_experts_ = c.n_routed_experts;
  std::map<const SafetensorsFile*, int> shard_index;
  for (const auto& s : ck.shards()) {
    shard_index[s.get()] = static_cast<int>(shard_paths_.size());
    shard_paths_.push_back(s->path());
  }
  constexpr uint64_t A = kDirectAlign;
  plans_.resize(static_cast<size_t>(n_layers_) * n_experts_);
  for (int l = 0; l < n_layers_; ++l) {
    for (int e = 0; e < n_experts_; ++e) {
      const ExpertLocation loc = locate_expert(ck, l, e);
      ExpertReadPlan& p = plans_[static_cast<size_t>(l) * n_experts_ + e];
      int order[6] = {0, 1, 2, 3, 4, 5};
      std::sort(order, order + 6, [&](int a, int b) {
        const int sa = shard_index[loc.parts[a].shard], sb = shard_index[loc.parts[b].shard];
        return sa != sb ? sa < sb : loc.parts[a].offset < loc.parts[b].offset;
      });
      // Group parts into windows, then place each window in the slot.
      uint64_t slot_end = 0;
      for (int i = 0; i < 6;) {
        const auto& first = loc.parts[order[i]];
        const int shard = shard_index[first.shard];
        uint64_t begin = first.offset, end = first.offset + first.bytes;
        int j = i + 1;
        while (j < 6 && shard_index[loc.parts[order[j]].shard] == shard &&
               loc.parts[order[j]].offset <= end + kCoalesceGapBytes) {
          end = std::max(end, loc.parts[order[j]].offset + loc.parts[order[j]].bytes);
          ++j;
        }
        ReadWindow w;
        w.shard = shard;
        w.file_offset = begin / A * A;
        w.needed = end - w.file_offset;
        w.length = (end + A - 1) / A * A - w.file_offset;
        w.slot_offset = slot_end;
        for (int k = i; k < j; ++k)
          p.part_offsets[order[k]] = w.slot_offset + (loc.parts[order[k]].offset - w.file_offset);
        slot_end += w.length;
        p.read_bytes += w.length;
        p.windows.push_back(w);
        i = j;
      }
      p.slot_bytes = slot_end;
      max_windows_ = std::max(max_windows_, static_cast<int>(p.windows.size()));
      p.payload_bytes = loc.total_bytes();
      slot_bytes_ = std::max(slot_bytes_, slot_end);
      uint64_t rounded = 0;
      for (const auto& part : loc.parts) rounded += (part.bytes + 63) / 64 * 64;
      max_payload_ = std::max(max_payload_, rounded);
    }
  }
  link_neighbours();
}

void ExpertLayout::link_neighbours() {
  const size_t n = plans_.size();
  next_.assign(n, -1);
  previous_.assign(n, -1);
  small_.assign(n, -1);
  struct Small {
    int shard;
    uint64_t offset, end;
    int expert;
  };
  std::vector<Small> smalls;
  for (int l = 0; l < n_layers_; ++l) {
    smalls.clear();
    for (int e = 0; e < n_experts_; ++e) {
      const size_t k = static_cast<size_t>(l) * n_experts_ + e;
      const std::vector<ReadWindow>& ws = plans_[k].windows;
      for (size_t w = 0; w < ws.size(); ++w) {
        if (ws[w].length > kMergeWindowBytes) continue;
        small_[k] = static_cast<int>(w);  // an expert has at most one in the known layouts; the last counts
      }
      if (small_[k] < 0) continue;
      const ReadWindow& w = ws[static_cast<size_t>(small_[k])];
      smalls.push_back({w.shard, w.file_offset, w.file_offset + w.length, e});
    }
    std::sort(smalls.begin(), smalls.end(),
              [](const Small& a, const Small& b) { return a.shard != b.shard ? a.shard < b.shard : a.offset < b.offset; });
    for (size_t i = 1; i < smalls.size(); ++i) {
      const Small &a = smalls[i - 1], &b = smalls[i];
      if (a.shard != b.shard || b.offset <= a.offset || b.offset > a.end || b.offset + kDirectAlign < a.end ||
          b.end <= a.end)
        continue;
      next_[static_cast<size_t>(l) * n_experts_ + a.expert] = b.expert;
      previous_[static_cast<size_t>(l) * n_experts_ + b.expert] = a.expert;
    }
  }
}

ExpertRangeCensus census_expert_ranges(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  ExpertRangeCensus census;
  for (int l = 0; l < c.num_layers; ++l) {
    for (int e = 0; e < c.n_routed_experts; ++e) {
      const ExpertLocation loc = locate_expert(ck, l, e);
      std::vector<const ExpertLocation::Part*> parts;
      for (const auto& p : loc.parts) parts.push_back(&p);
      std::sort(parts.begin(), parts.end(), [](auto* a, auto* b) {
        return a->shard != b->shard ? std::less<>()(a->shard, b->shard) : a->offset < b->offset;
      });
      int ranges = 1;
      bool straddles = false;
      for (size_t i = 1; i < parts.size(); ++i) {
        if (parts[i]->shard != parts[i - 1]->shard) straddles = true;
        if (parts[i]->shard != parts[i - 1]->shard || parts[i]->offset != parts[i - 1]->offset + parts[i - 1]->bytes)
          ++ranges;
      }
      ++census.experts_by_ranges[ranges];
      census.straddling += straddles;
      ++census.experts;
    }
  }
  return census;
}

}  // namespace dsv4
