#include "dsv4/experts/ssd_probe.h"

#include <fcntl.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "dsv4/experts/read_queue.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4 {

void drop_page_cache(const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    File f = File::open_read(path);
    ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
}

SsdProbeResult probe_direct_read(const std::vector<std::string>& files, uint64_t max_bytes, int depth,
                                 IoBackend backend, double skip_fraction) {
  constexpr uint64_t kBlock = 4ull << 20;
  drop_page_cache(files);
  struct Target {
    File buffered, direct;
    const std::string* path;
    uint64_t size;
  };
  std::vector<Target> targets;
  uint64_t total = 0;
  SsdProbeResult result;
  for (const std::string& path : files) {
    Target t{File::open_read(path), File::open_direct(path), &path, 0};
    t.size = t.buffered.size() / kBlock * kBlock;  // whole blocks only
    if (!t.direct.valid()) result.direct = false;
    total += t.size;
    if (t.size > 0) targets.push_back(std::move(t));
  }
  if (total == 0) fail("ssd probe: the files hold no complete 4 MiB block");
  const uint64_t want = std::min(max_bytes / kBlock * kBlock, total);

  // Blocks in order, starting skip_fraction into the concatenated files.
  std::vector<std::pair<size_t, uint64_t>> blocks;  // (target, offset)
  uint64_t start = static_cast<uint64_t>(skip_fraction * double(total)) / kBlock * kBlock;
  for (uint64_t pos = start; blocks.size() * kBlock < want; pos = (pos + kBlock) % total) {
    uint64_t p = pos;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (p < targets[i].size) {
        blocks.emplace_back(i, p);
        break;
      }
      p -= targets[i].size;
    }
  }

  AlignedBuffer buffers(static_cast<size_t>(depth) * kBlock);
  std::mutex mutex;
  std::condition_variable finished;
  size_t next = 0, done = 0;
  std::string error;
  std::unique_ptr<ReadQueue> queue;
  auto submit = [&](size_t slot) {  // called with `mutex` held
    const auto [t, offset] = blocks[next++];
    ReadOp op;
    op.fd = targets[t].direct.valid() ? targets[t].direct.fd() : targets[t].buffered.fd();
    op.buffered_fd = targets[t].buffered.fd();
    op.path = targets[t].path;
    op.offset = offset;
    op.length = op.needed = kBlock;
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
  if (backend != IoBackend::kThreads) queue = make_uring_read_queue(depth, on_done);
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
  result.bytes = blocks.size() * kBlock;
  drop_page_cache(files);
  return result;
}

}  // namespace dsv4
