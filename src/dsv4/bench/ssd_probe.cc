#include "dsv4/bench/ssd_probe.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "dsv4/platform/read_queue.h"
#include "dsv4/util/error.h"
#include "dsv4/platform/platform.h"
#include "dsv4/util/file.h"

namespace dsv4 {

void drop_page_cache(const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    File f = File::open_read(path);
    platform::drop_cached_pages(f.fd());
  }
}

SsdProbeResult probe_direct_read(const std::vector<std::string>& files, uint64_t max_bytes, int depth,
                                 IoBackend backend, double skip_fraction, uint64_t block_bytes) {
  const uint64_t kBlock = std::max<uint64_t>(kDirectAlign, block_bytes / kDirectAlign * kDirectAlign);
  drop_page_cache(files);
  struct Target {
    File buffered, direct;
    const std::string* path;
  };
  struct Block {
    size_t target;
    uint64_t offset, length;
  };
  std::vector<Target> targets;
  std::vector<Block> all;
  SsdProbeResult result;
  for (const std::string& path : files) {
    Target t{File::open_read(path), File::open_direct(path), &path};
    const uint64_t size = t.buffered.size() / kDirectAlign * kDirectAlign;  // O_DIRECT needs whole pages
    if (!t.direct.valid()) result.direct = false;
    for (uint64_t off = 0; off < size; off += kBlock) all.push_back({targets.size(), off, std::min(kBlock, size - off)});
    targets.push_back(std::move(t));
  }
  if (all.empty()) fail("ssd probe: the checkpoint files are too small to measure");
  // Blocks in file order, starting skip_fraction into the set and wrapping around.
  std::vector<Block> blocks;
  uint64_t planned = 0;
  const size_t first = std::min(all.size() - 1, static_cast<size_t>(skip_fraction * double(all.size())));
  for (size_t i = 0; i < all.size() && planned < max_bytes; ++i) {
    blocks.push_back(all[(first + i) % all.size()]);
    planned += blocks.back().length;
  }

  AlignedBuffer buffers(static_cast<size_t>(depth) * kBlock);
  std::mutex mutex;
  std::condition_variable finished;
  size_t next = 0, done = 0;
  std::string error;
  std::unique_ptr<ReadQueue> queue;
  auto submit = [&](size_t slot) {  // called with `mutex` held
    const Block b = blocks[next++];
    const Target& t = targets[b.target];
    ReadOp op;
    op.fd = t.direct.valid() ? t.direct.fd() : t.buffered.fd();
    op.buffered_fd = t.buffered.fd();
    op.path = t.path;
    op.offset = b.offset;
    op.length = op.needed = b.length;
    op.dst = buffers.data() + slot * kBlock;
    queue->submit(slot, {op});
  };
  auto on_done = [&](uint64_t slot, const ReadOutcome& outcome) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!outcome.error.empty() && error.empty()) error = outcome.error;
    if (!outcome.refused_direct.empty()) result.direct = false;
    ++done;
    if (next < blocks.size() && error.empty()) submit(static_cast<size_t>(slot));
    finished.notify_all();
  };
  if (backend != IoBackend::kThreads) queue = make_native_read_queue(depth, on_done);
  if (!queue) queue = make_thread_read_queue(depth, on_done);

  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex);
    for (int s = 0; s < depth && next < blocks.size(); ++s) submit(static_cast<size_t>(s));
    finished.wait(lock, [&] { return done == next && (next == blocks.size() || !error.empty()); });
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  queue.reset();
  if (!error.empty()) throw Error(error);
  result.bytes = planned;
  drop_page_cache(files);
  return result;
}

}  // namespace dsv4
