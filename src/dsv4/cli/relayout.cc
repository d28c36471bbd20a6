// dsv4 relayout SRC DST [--layout official|contiguous]: a copy of a checkpoint with each
// shard's tensors in the other order, every tensor's bytes unchanged (io/relayout.h).
#include <chrono>
#include <cstdio>

#include "dsv4/cli/commands.h"
#include "dsv4/io/relayout.h"

namespace dsv4::cli {

int relayout(const RelayoutOptions& o) {
  const TensorLayout layout = parse_tensor_layout(o.layout);
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const RelayoutResult r = relayout_checkpoint(o.src, o.dst, layout, [&](uint64_t done, uint64_t total) {
    if (!o.quiet)
      std::fprintf(stderr, "dsv4 relayout: %.2f / %.2f GB written (%.0f s)\n", done / 1e9, total / 1e9, seconds());
  });
  if (!o.quiet)
    std::fprintf(stderr, "dsv4 relayout: wrote %s (%s layout, %d shards, %.2f GB) in %.1f s\n", o.dst.c_str(),
                 tensor_layout_name(layout), r.shards, r.tensor_bytes / 1e9, seconds());
  return 0;
}

}  // namespace dsv4::cli
