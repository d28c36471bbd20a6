// Rewrites a checkpoint into one of the two byte layouts (tensor_order.h). Every shard keeps
// its file name, its tensors and their bytes, and its header keeps its metadata; only the
// order of the tensors inside each shard changes, so the index, the sharding (and with it any
// expert split between shards) stay as they were. The folder's other files (config, tokenizer,
// references) are copied unchanged. For comparing layouts on the same tensors and for the
// tests, which run the fixtures in both.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dsv4/io/tensor_order.h"

namespace dsv4 {

struct RelayoutResult {
  int shards = 0;
  uint64_t tensor_bytes = 0;
};

// Called after each shard with (tensor bytes written so far, total).
using RelayoutProgress = std::function<void(uint64_t done, uint64_t total)>;

// Writes the re-laid copy of `src` into `dst` (created if missing; must not be `src`).
// Throws Error naming the file or tensor at fault.
RelayoutResult relayout_checkpoint(const std::string& src, const std::string& dst, TensorLayout layout,
                                   const RelayoutProgress& progress = nullptr);

}  // namespace dsv4
