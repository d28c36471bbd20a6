// The SSD's own O_DIRECT read bandwidth, measured on the checkpoint's shards the way the
// expert store reads (same read queue, several large reads in flight), so a benchmark can
// compare its expert reads with what the device gives in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/experts/expert_store.h"

namespace dsv4 {

struct SsdProbeResult {
  uint64_t bytes = 0;
  double seconds = 0;
  bool direct = true;  // false if a file refused O_DIRECT (the figure is then buffered)
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

// Drops the files from the page cache (POSIX_FADV_DONTNEED), then reads up to `max_bytes`
// from them (a span starting `skip_fraction` into the set, wrapping around) in aligned
// reads of `block_bytes`, `depth` in flight.
SsdProbeResult probe_direct_read(const std::vector<std::string>& files, uint64_t max_bytes, int depth,
                                 IoBackend backend = IoBackend::kAuto, double skip_fraction = 0.0,
                                 uint64_t block_bytes = 4ull << 20);

// POSIX_FADV_DONTNEED on each file (best effort).
void drop_page_cache(const std::vector<std::string>& files);

}  // namespace dsv4
