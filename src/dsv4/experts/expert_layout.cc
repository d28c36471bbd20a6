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
