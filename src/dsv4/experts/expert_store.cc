#include "dsv4/experts/expert_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "dsv4/io/checkpoint.h"
#include "dsv4/io/schema.h"
#include "dsv4/io/value_check.h"
#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A read in flight is known to the queue by its slot and the expert it is for.
uint64_t make_tag(int slot, int32_t key) { return (uint64_t(uint32_t(key)) << 32) | uint32_t(slot); }
int tag_slot(uint64_t tag) { return static_cast<int>(tag & 0xFFFFFFFFu); }
int32_t tag_key(uint64_t tag) { return static_cast<int32_t>(tag >> 32); }
// A merged read of several slots: key -1 and the group's id.
uint64_t group_tag(uint32_t id) { return (uint64_t{0xFFFFFFFFu} << 32) | id; }

// At most this many experts share one merged read (each is a span of it).
constexpr size_t kMaxMergedExperts = 8;
static_assert(kMaxMergedExperts <= size_t(platform::kMaxIoSpans));

// A read that keeps looking suspicious (a shard rewritten over and over) is given up
// after this many repeats.
constexpr int kMaxRetries = 4;

// The copies of every shard: the checkpoint's own, then the same file name in each mirror.
std::vector<ShardFiles::Source> shard_sources(const Checkpoint& ck, const std::vector<std::string>& shard_paths,
                                              const std::vector<std::string>& mirrors) {
  namespace fs = std::filesystem;
  std::vector<std::string> folders{ck.dir()};
  for (const std::string& m : mirrors) {
    if (!is_directory(m)) fail("--mirror {}: not a directory", m);
    folders.push_back(m);
  }
  auto same_dir = [](const std::string& a, const std::string& b) {
    std::error_code ec;
    return fs::equivalent(a, b, ec);
  };
  for (size_t f = 1; f < folders.size(); ++f) {
    for (size_t g = 0; g < f; ++g)
      if (same_dir(folders[f], folders[g])) fail("--mirror {}: is the same folder as {}", folders[f], folders[g]);
    const std::string config = folders[f] + "/config.json";
    if (path_exists(config) && read_small_file(config, 16 << 20) != read_small_file(ck.dir() + "/config.json", 16 << 20))
      fail("--mirror {}: its config.json differs from {}/config.json; a mirror must hold the same checkpoint",
           folders[f], ck.dir());
  }
  std::vector<ShardFiles::Source> sources;
  std::vector<int> found(folders.size(), 0);
  for (const std::string& path : shard_paths) {
    ShardFiles::Source src;
    const std::string name = fs::path(path).filename().string();
    int own = 0;
    for (size_t f = 0; f < folders.size(); ++f)
      if (same_dir(fs::path(path).parent_path().string(), folders[f])) own = static_cast<int>(f);
    src.copies.push_back({own, path});
    ++found[own];
    for (size_t f = 0; f < folders.size(); ++f) {
      if (static_cast<int>(f) == own || !path_exists(folders[f] + "/" + name)) continue;
      src.copies.push_back({static_cast<int>(f), folders[f] + "/" + name});
      ++found[f];
    }
    sources.push_back(std::move(src));
  }
  for (size_t f = 1; f < folders.size(); ++f)
    if (found[f] == 0) fail("--mirror {}: holds none of the checkpoint's shards", folders[f]);
  return sources;
}

// One read request: `length` bytes (`needed` of them must arrive) of `copy` at `file_offset`
// into `dst`.
ReadOp read_op(const ShardFiles& files, int copy, uint64_t file_offset, uint64_t length, uint64_t needed,
               uint8_t* dst) {
  const ShardFiles::Fds fds = files.fds(copy);
  ReadOp op;
  op.fd = fds.read_fd;
  op.buffered_fd = fds.buffered_fd;
  op.shard = copy;
  op.path = fds.path;
  op.offset = file_offset;
  op.length = length;
  op.needed = needed;
  op.dst = dst;
  return op;
}

}  // namespace

IoBackend parse_io_backend(const std::string& text) {
  if (text == "auto") return IoBackend::kAuto;
  if (text == "threads") return IoBackend::kThreads;
  const std::string native = platform::native_read_queue_name();
  const bool uring = text == "uring" || text == "io_uring", iocp = text == "iocp" || text == "IOCP";
  if ((uring && native == "io_uring") || (iocp && native == "IOCP")) return IoBackend::kNative;
  if (uring || iocp)
    fail("--io \"{}\": not available on {} (expected auto, threads{})", text, platform::os_name(),
         native.empty() ? "" : native == "IOCP" ? " or iocp" : " or uring");
  fail("--io \"{}\": expected auto, {}threads", text, native.empty() ? "" : native == "IOCP" ? "iocp, " : "uring, ");
}

std::vector<double> parse_read_shares(const std::string& text) {
  std::vector<double> shares;
  if (text.empty()) return shares;
  size_t begin = 0;
  for (;;) {
    const size_t end = text.find(',', begin);
    const std::string item = text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    char* stop = nullptr;
    const double v = std::strtod(item.c_str(), &stop);
    if (item.empty() || *stop != '\0' || !(v >= 0) || !std::isfinite(v))
      fail("--read-shares \"{}\": expected non-negative numbers separated by commas, e.g. 2,1", text);
    shares.push_back(v);
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return shares;
}

void check_mirrors(const Checkpoint& ck, const std::vector<std::string>& mirrors) {
  if (mirrors.empty()) return;
  const ShardFiles files(shard_sources(ck, ExpertLayout(ck).shard_paths(), mirrors), false, true);
}

ExpertStore::ExpertStore(const Checkpoint& ck, const ExpertStoreOptions& options)
    : options_(options),
      layout_(ck),
      n_experts_(layout_.n_experts()),
      config_(ck.config()),
      policy_(options.cache_policy, options.slots,
              CachePolicyShape{layout_.n_layers(), n_experts_, config_.num_hash_layers, config_.n_experts_per_token}) {
  if (options_.slots < 1) fail("expert store: needs at least one slot, got {}", options_.slots);
  if (options_.queue_depth < 1) fail("expert store: queue depth must be at least 1");
  slot_bytes_ = layout_.slot_bytes();

  files_ = std::make_unique<ShardFiles>(shard_sources(ck, layout_.shard_paths(), options_.mirrors),
                                        options_.direct_io, options_.quiet);
  if (options_.direct_io && !files_->all_direct()) {
    for (int s = 0; s < files_->shard_count(); ++s)
      for (int c : files_->copies_of(s))
        if (files_->fds(c).read_fd == files_->fds(c).buffered_fd) {
          note_buffered(*files_->fds(c).path);
          break;
        }
  }
  const int folders = files_->folder_count();
  folder_in_flight_.assign(static_cast<size_t>(folders), 0);
  folder_busy_since_.assign(static_cast<size_t>(folders), 0.0);
  folder_queued_.assign(static_cast<size_t>(folders), 0);
  stats_.folder_bytes.assign(static_cast<size_t>(folders), 0);
  stats_.folder_busy_seconds.assign(static_cast<size_t>(folders), 0.0);
  if (!options_.read_shares.empty() && static_cast<int>(options_.read_shares.size()) != folders)
    fail("--read-shares: {} shares given for {} folders (-m DIR's, then each --mirror)", options_.read_shares.size(),
         folders);

  // One buffer for all slots (slot_bytes_ is a multiple of the O_DIRECT alignment). It is
  // in huge pages like every large weight buffer, and nothing is resident until a read
  // fills a slot.
  const size_t slot_memory_bytes = static_cast<size_t>(options_.slots) * slot_bytes_;
  try {
    slot_memory_ = AlignedBuffer(slot_memory_bytes);
  } catch (const Error&) {
    fail("expert store: cannot map {} bytes for {} slots", slot_memory_bytes, options_.slots);
  }

  slots_.resize(static_cast<size_t>(options_.slots));
  slot_of_.assign(static_cast<size_t>(layout_.n_layers()) * n_experts_, -1);

  auto done = [this](uint64_t tag, const ReadOutcome& outcome) { on_read_done(tag, outcome); };
  if (options_.backend != IoBackend::kThreads)
    queue_ = make_native_read_queue(options_.queue_depth, done, options_.faults);
  if (!queue_) {
    if (options_.backend == IoBackend::kNative)
      fail("expert store: {} is not available here", platform::native_read_queue_name());
    queue_ = make_thread_read_queue(pread_workers(options_.queue_depth), done, options_.faults);
  }

  if (!options_.read_shares.empty()) {
    shares_ = options_.read_shares;
  } else if (folders > 1) {
    shares_ = measure_shares();
  } else {
    shares_ = {1.0};
  }
  double total = 0;
  for (double s : shares_) {
    if (!(s >= 0) || !std::isfinite(s)) fail("expert store: read shares must be non-negative numbers");
    total += s;
  }
  if (!(total > 0)) fail("--read-shares: the shares add up to zero");
  for (double& s : shares_) s /= total;
}

int ExpertStore::pread_workers(int experts) const {
  // A pread worker serves one request at a time: enough of them for `experts` experts with
  // every request in flight at once (each window, and each folder's piece of it), as io_uring
  // has them. In the official layout an expert is two windows (weights, then scales).
  const int requests_per_expert = layout_.max_windows() * files_->folder_count();
  return std::min(64, experts * requests_per_expert);
}

ExpertStore::~ExpertStore() {
  queue_->stop();  // waits for reads in flight (they write into the slots); the queue stays valid meanwhile
}

// Each folder's read bandwidth with the store's own pattern: whole experts, O_DIRECT into
// the (still unused) slots, queue_depth reads in flight, experts spread over the layers.
std::vector<double> ExpertStore::measure_shares() {
  const int folders = files_->folder_count();
  const int n = std::max(2 * options_.queue_depth, 8);
  std::vector<double> gbps(static_cast<size_t>(folders), 0.0);
  const int depth = std::min<int>(options_.queue_depth, static_cast<int>(slots_.size()));
  for (int f = 0; f < folders; ++f) {
    std::mutex m;
    std::condition_variable cv;
    int in_flight = 0;
    uint64_t bytes = 0;
    std::string error;
    auto done = [&](uint64_t, const ReadOutcome& o) {
      std::lock_guard<std::mutex> lock(m);
      --in_flight;
      if (!o.error.empty() && error.empty()) error = o.error;
      cv.notify_all();
    };
    std::unique_ptr<ReadQueue> q;
    if (options_.backend != IoBackend::kThreads) q = make_native_read_queue(depth, done, options_.faults);
    if (!q) q = make_thread_read_queue(pread_workers(depth), done, options_.faults);
    const double t0 = now_seconds();
    for (int i = 0; i < n; ++i) {
      // Experts spread over the layers and ids, each whole from this folder's copies.
      const int64_t total = int64_t(layout_.n_layers()) * n_experts_;
      const int32_t k = static_cast<int32_t>((int64_t(i) * 7919 + 13) % total);
      const ExpertReadPlan& plan = layout_.plan(k / n_experts_, k % n_experts_);
      uint8_t* base = slot_memory_.data() + static_cast<size_t>(i % depth) * slot_bytes_;
      // A window of a shard this folder lacks is not part of its measure.
      std::vector<ReadOp> ops;
      for (const ReadWindow& w : plan.windows)
        for (int c : files_->copies_of(w.shard))
          if (files_->folder_of(c) == f)
            ops.push_back(read_op(*files_, c, w.file_offset, w.length, w.needed, base + w.slot_offset));
      for (const ReadOp& op : ops) bytes += op.length;
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return in_flight < depth; });
      ++in_flight;
      lock.unlock();
      q->submit(uint64_t(i), std::move(ops));
    }
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return in_flight == 0; });
    }
    const double seconds = now_seconds() - t0;
    q->stop();
    if (!error.empty()) fail("expert store: measuring the read speed of folder {}: {}", f, error);
    gbps[f] = seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0;
  }
  if (!options_.quiet) {
    std::string line = "dsv4: expert read speed per folder:";
    for (int f = 0; f < folders; ++f) line += fmt::format(" {:.2f} GB/s", gbps[f]);
    std::fprintf(stderr, "%s (reads shared in proportion)\n", line.c_str());
  }
  return gbps;
}

int ExpertStore::folder_of(int layer, int expert) const {
  // A low-discrepancy walk over [0, 1): consecutive keys spread evenly, so each folder's
  // share of the experts (and of any layer's experts) follows its read share.
  const double u = std::fmod(double(key(layer, expert) + 1) * 0.6180339887498949, 1.0);
  double edge = 0;
  for (size_t f = 0; f + 1 < shares_.size(); ++f) {
    edge += shares_[f];
    if (u < edge) return static_cast<int>(f);
  }
  return static_cast<int>(shares_.size()) - 1;
}

void ExpertStore::note_buffered(const std::string& path) {
  if (warned_buffered_ || options_.quiet) return;
  warned_buffered_ = true;
  std::fprintf(stderr, "dsv4: note: %s refuses O_DIRECT; routed experts are read through the page cache\n",
               path.c_str());
}

std::string ExpertStore::expert_name(int32_t k) const {
  return fmt::format("expert {} of layer {}", k % n_experts_, k / n_experts_);
}

void ExpertStore::check_key(int layer, int expert) const {
  if (layer < 0 || layer >= layout_.n_layers() || expert < 0 || expert >= n_experts_)
    fail("expert store: expert {} of layer {} does not exist", expert, layer);
}

bool ExpertStore::evictable(const Slot& s, bool allow_reserved) const {
  return s.pins == 0 && s.state != State::kLoading && (allow_reserved || !reserved(s));
}

int ExpertStore::find_victim(bool allow_reserved) const {
  return policy_.victim([&](int i) { return evictable(slots_[static_cast<size_t>(i)], allow_reserved); });
}

void ExpertStore::submit(Submissions& out) {
  for (Submission& s : out) queue_->submit(s.tag, std::move(s.ops));
  out.clear();
}

void ExpertStore::start_read(int v, int32_t k, Origin origin, Submissions& out) {
  Slot& s = slots_[v];
  if (s.key >= 0) slot_of_[s.key] = -1;
  if (s.unused_prediction) {
    ++stats_.predicted_unused;
    --predicted_unused_slots_;
  }
  s.key = k;
  s.state = State::kLoading;
  s.origin = origin;
  s.fresh = false;
  s.unused_prediction = origin == Origin::kPredict || origin == Origin::kExpect;
  s.error.clear();
  s.bad_copies.clear();
  s.failures.clear();
  s.retries = 0;
  policy_.loaded(v, k);
  slot_of_[k] = v;
  if (origin == Origin::kPredict) {
    ++stats_.predicted_reads;
    ++loading_predicted_;
  }
  if (s.unused_prediction) ++predicted_unused_slots_;
  if (origin == Origin::kExpect) ++stats_.expected_reads;
  if (origin == Origin::kDemand) ++stats_.demand_reads;

  const ExpertReadPlan& plan = layout_.plan(k / n_experts_, k % n_experts_);
  s.weights = expert_views(config_, slot_memory_.data() + static_cast<size_t>(v) * slot_bytes_, plan.part_offsets);
  if (loading_++ == 0) busy_since_ = now_seconds();
  if (!issue(v, out)) {  // cannot happen on a first try: every shard has a copy
    s.failures = "no copy of its shards to read";
    finish_read(s);
    s.state = State::kFailed;
    s.error = fmt::format("{}: {}", expert_name(k), s.failures);
  }
}

void ExpertStore::plan_pieces(int32_t k, const ReadWindow& w, const std::vector<int>& usable,
                              std::vector<Piece>& out) const {
  // Each usable copy's weight: its folder's share (all equal when none of them has one).
  const size_t n = usable.size();
  std::vector<double> weight(n), split(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += weight[i] = shares_[files_->folder_of(usable[i])];
  if (!(total > 0)) {
    std::fill(weight.begin(), weight.end(), 1.0);
    total = double(n);
  }
  // The window is split over the folders in proportion to their weights, leaving out a
  // folder whose piece would be under the minimum (requests that small waste a drive's time).
  const uint64_t min_piece = std::max<uint64_t>(options_.min_piece_bytes, kDirectAlign);
  double split_total = 0;
  int sharing = 0;
  for (size_t i = 0; i < n; ++i) {
    split[i] = double(w.needed) * weight[i] / total >= double(min_piece) ? weight[i] : 0.0;
    split_total += split[i];
    sharing += split[i] > 0;
  }
  if (sharing < 2) {
    // Whole, from the copy whose folder would finish it first (its queued bytes and this
    // window's over its weight); ties go to the folder the expert prefers, then the first copy.
    const int preferred = folder_of(k / n_experts_, k % n_experts_);
    int pick = -1;
    double pick_end = 0;
    for (size_t i = 0; i < n; ++i) {
      if (weight[i] <= 0) continue;
      const int f = files_->folder_of(usable[i]);
      const double end = double(folder_queued_[f] + w.length) / weight[i];
      if (pick < 0 || end < pick_end || (end == pick_end && f == preferred)) {
        pick = usable[i];
        pick_end = end;
      }
    }
    out.push_back({pick, -1, files_->folder_of(pick), w.slot_offset, w.length, w.file_offset, w.needed});
    return;
  }
  // Cut at 4 KiB boundaries (O_DIRECT); the last piece takes the slack past `needed`.
  uint64_t at = 0;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    if (split[i] <= 0) continue;
    cumulative += split[i];
    const bool last = --sharing == 0;
    const uint64_t cut = uint64_t(double(w.needed) * cumulative / split_total) / kDirectAlign * kDirectAlign;
    const uint64_t end = last ? w.needed : std::min(cut, w.needed);
    if (end <= at) continue;
    out.push_back({usable[i], -1, files_->folder_of(usable[i]), w.slot_offset + at, (last ? w.length : end) - at,
                   w.file_offset + at, end - at});
    at = end;
  }
}

bool ExpertStore::issue(int v, Submissions& out) {
  Slot& s = slots_[v];
  s.shared_bytes = 0;  // (a retry reads every window itself)
  const int32_t k = s.key;
  const ExpertReadPlan& plan = layout_.plan(k / n_experts_, k % n_experts_);
  auto bad = [&](int c) { return std::find(s.bad_copies.begin(), s.bad_copies.end(), c) != s.bad_copies.end(); };
  std::vector<Piece> pieces;
  std::vector<int> usable;
  for (const ReadWindow& w : plan.windows) {
    // The copies not failed and not refused, else the first not yet failed (reading a
    // refused copy re-checks it, which reopens a shard restored meanwhile).
    usable.clear();
    int fallback = -1;
    for (int c : files_->copies_of(w.shard)) {
      if (bad(c)) continue;
      if (fallback < 0) fallback = c;
      if (!files_->refused(c)) usable.push_back(c);
    }
    if (fallback < 0) return false;  // no copy left to try
    if (usable.empty()) usable.push_back(fallback);
    plan_pieces(k, w, usable, pieces);
  }
  uint8_t* base = slot_memory_.data() + static_cast<size_t>(v) * slot_bytes_;
  std::vector<ReadOp> ops;
  const double now = now_seconds();
  for (Piece& p : pieces) {
    ops.push_back(read_op(*files_, p.copy, p.file_offset, p.length, p.needed, base + p.slot_offset));
    p.fd = ops.back().fd;
    if (folder_in_flight_[p.folder]++ == 0) folder_busy_since_[p.folder] = now;
    folder_queued_[p.folder] += p.length;
  }
  stats_.read_pieces += pieces.size();
  s.pieces = std::move(pieces);
  out.push_back({make_tag(v, k), std::move(ops)});
  return true;
}

void ExpertStore::pump(Submissions& out) {
  // Starts the reads at the front of `queue` while `room()` says the queue may take more;
  // true when none is left waiting.
  auto drain = [&](std::deque<int32_t>& queue, Origin origin, auto room) {
    while (!queue.empty() && room()) {
      const int32_t k = queue.front();
      if (slot_of_[k] >= 0) {
        queue.pop_front();
        continue;
      }
      const int v = find_victim(false);
      if (v < 0) break;
      queue.pop_front();
      start_read(v, k, origin, out);
      if (origin == Origin::kPrefetch) slots_[v].reserved_epoch = epoch_;
      if (origin != Origin::kPredict) start_neighbours(k, queue, origin, out);
    }
    return queue.empty();
  };
  // Needed experts first, in the order they will be acquired, then the certain ones of the
  // coming layers. Only queue_depth reads are handed to the queue at a time, so a later,
  // more urgent request never waits behind a long list of queued guesses.
  if (!drain(want_needed_, Origin::kPrefetch, [&] { return loading_ < options_.queue_depth; })) return;
  const int cap = options_.max_predicted_slots >= 0 ? options_.max_predicted_slots
                                                     : std::max<int>(1, static_cast<int>(slots_.size() / 2));
  if (!drain(want_expected_, Origin::kExpect,
             [&] { return loading_ < options_.queue_depth && predicted_unused_slots_ < cap; }))
    return;
  const bool idle_only = options_.max_predicted_in_flight >= 0;
  if (idle_only && loading_ > loading_predicted_) return;  // a needed read is in flight
  const int max_guesses = idle_only ? options_.max_predicted_in_flight : options_.queue_depth;
  drain(want_predicted_, Origin::kPredict, [&] {
    return loading_ < options_.queue_depth && loading_predicted_ < max_guesses && predicted_unused_slots_ < cap;
  });
}

void ExpertStore::start_neighbours(int32_t k, std::deque<int32_t>& queue, Origin origin, Submissions& out) {
  if (out.empty() || tag_key(out.back().tag) != k) return;  // k's read could not start
  const size_t first = out.size() - 1;
  const int layer = k / n_experts_;
  auto neighbour = [&](int32_t of, bool next) {
    const int e = next ? layout_.next_in_file(layer, of % n_experts_) : layout_.previous_in_file(layer, of % n_experts_);
    return e < 0 ? int32_t{-1} : key(layer, e);
  };
  // Starts n's read if it waits in `queue` and a slot is free for it.
  auto take = [&](int32_t n) {
    if (n < 0 || slot_of_[n] >= 0) return false;
    const auto at = std::find(queue.begin(), queue.end(), n);
    if (at == queue.end()) return false;
    const int v = find_victim(false);
    if (v < 0) return false;
    queue.erase(at);
    const size_t before = out.size();
    start_read(v, n, origin, out);
    if (origin == Origin::kPrefetch) slots_[v].reserved_epoch = epoch_;
    return out.size() > before;
  };
  std::vector<int32_t> run{k};
  for (int32_t n = neighbour(k, false); run.size() < kMaxMergedExperts && take(n); n = neighbour(n, false))
    run.insert(run.begin(), n);
  for (int32_t n = neighbour(run.back(), true); run.size() < kMaxMergedExperts && take(n); n = neighbour(n, true))
    run.push_back(n);
  if (run.size() > 1) merge_reads(run, first, out);
}

void ExpertStore::merge_reads(const std::vector<int32_t>& run, size_t first, Submissions& out) {
  // out[first..] holds one submission per member of `run` (started in another order).
  Submissions mine(std::make_move_iterator(out.begin() + static_cast<std::ptrdiff_t>(first)),
                   std::make_move_iterator(out.end()));
  out.resize(first);
  auto small_op = [&](const Submission& sub) -> int {
    const int32_t k = tag_key(sub.tag);
    const int w = layout_.small_window(k / n_experts_, k % n_experts_);
    if (w < 0) return -1;
    const ReadWindow& win = layout_.plan(k / n_experts_, k % n_experts_).windows[static_cast<size_t>(w)];
    for (size_t i = 0; i < sub.ops.size(); ++i)
      if (sub.ops[i].offset == win.file_offset && sub.ops[i].length == win.length) return static_cast<int>(i);
    return -1;  // split over folders: not merged
  };
  Submission job;
  std::vector<GroupMember> members;
  int merged = -1;  // the merged op's index in job.ops
  auto flush = [&] {
    if (members.empty()) return;
    if (members.size() > 1) {
      const uint32_t id = next_group_++;
      groups_[id] = std::move(members);
      job.tag = group_tag(id);
    }
    out.push_back(std::move(job));
    job = Submission{};
    members.clear();
    merged = -1;
  };
  for (int32_t k : run) {
    auto it = std::find_if(mine.begin(), mine.end(), [&](const Submission& sub) { return tag_key(sub.tag) == k; });
    Submission& sub = *it;
    const int v = tag_slot(sub.tag);
    const int b = small_op(sub);
    bool joined = false;
    if (merged >= 0 && b >= 0) {
      ReadOp& a = job.ops[static_cast<size_t>(merged)];
      const ReadOp& next = sub.ops[static_cast<size_t>(b)];
      const uint64_t a_end = a.offset + a.length;
      if (next.fd == a.fd && next.buffered_fd == a.buffered_fd && next.offset <= a_end &&
          next.offset + kDirectAlign >= a_end && next.offset + next.length > a_end) {
        const uint64_t skip = a_end - next.offset;  // the page both windows hold, if they share one
        if (a.spans.empty()) a.spans.push_back({a.dst, a.length});
        const platform::IoSpan last = a.spans.back();
        a.spans.push_back({next.dst + skip, next.length - skip});
        a.length += next.length - skip;
        a.needed = next.offset + next.needed - a.offset;
        GroupMember m{v, k, next.dst, last.dst + last.length - skip, skip};
        slots_[static_cast<size_t>(v)].shared_bytes = skip;
        members.push_back(m);
        for (size_t i = 0; i < sub.ops.size(); ++i)
          if (static_cast<int>(i) != b) job.ops.push_back(std::move(sub.ops[i]));
        ++stats_.merged_windows;
        joined = true;
      }
    }
    if (!joined) {
      flush();
      job = std::move(sub);
      members.push_back({v, k, nullptr, nullptr, 0});
      merged = b;
    }
  }
  flush();
}

void ExpertStore::finish_read(Slot& s) {
  if (--loading_ == 0) stats_.read_seconds += now_seconds() - busy_since_;
  if (s.origin == Origin::kPredict) --loading_predicted_;
}

void ExpertStore::pieces_done(const Slot& s, bool success) {
  const double now = now_seconds();
  for (const Piece& p : s.pieces) {
    if (--folder_in_flight_[p.folder] == 0) stats_.folder_busy_seconds[p.folder] += now - folder_busy_since_[p.folder];
    folder_queued_[p.folder] -= p.length;
    if (success) stats_.folder_bytes[p.folder] += p.length;
  }
}

void ExpertStore::on_read_done(uint64_t tag, const ReadOutcome& outcome) {
  for (int copy : outcome.refused_direct)
    if (files_->stop_direct(copy)) note_buffered(*files_->fds(copy).path);
  if (tag_key(tag) >= 0) {
    slot_read_done(tag_slot(tag), tag_key(tag), outcome, false);
    return;
  }
  std::vector<GroupMember> members;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find(static_cast<uint32_t>(tag_slot(tag)));
    members = std::move(it->second);
    groups_.erase(it);
  }
  // The page two neighbours share was read into the first one's slot; every slot is still
  // loading (ours), so the copy races with nothing.
  const bool failed = !outcome.error.empty();
  if (!failed)
    for (const GroupMember& m : members)
      if (m.shared > 0) std::memcpy(m.shared_to, m.shared_from, m.shared);
  for (size_t i = 0; i < members.size(); ++i) {
    ReadOutcome mine = outcome;
    if (i > 0) mine.requests = 0;  // the job's requests are counted once
    slot_read_done(members[i].slot, members[i].key, mine, failed);
  }
}

void ExpertStore::slot_read_done(int v, int32_t k, const ReadOutcome& outcome, bool group_failed) {
  // Outside the cache lock: the slot is ours while it loads. Which copies served it, and
  // are they still the files we validated (size, header, same inode)?
  std::vector<Piece> pieces;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pieces = slots_[v].pieces;
  }
  files_->check_now_and_then(now_seconds());
  bool retry = false;
  int bad_copy = -1;
  std::string problem;
  for (const Piece& p : pieces) {
    std::string why;
    // (A merged read that failed is read again by each member alone, below, so the fault is
    // met by the expert whose bytes it is in and named after it, as without merging.)
    const bool failed = !group_failed && !outcome.error.empty() && outcome.failed_shard == p.copy;
    const ShardFiles::Verdict verdict = files_->after_read(p.copy, p.fd, failed, &why);
    if (verdict == ShardFiles::Verdict::kRetry) {
      retry = true;  // reopened (or rewritten with the same header): read it again
    } else if (bad_copy < 0 && (verdict == ShardFiles::Verdict::kRefused || failed)) {
      bad_copy = p.copy;
      problem = verdict == ShardFiles::Verdict::kRefused ? why : outcome.error;
    }
  }
  if (group_failed) retry = true;
  if (bad_copy < 0 && !retry) {
    int part = -1;
    const ExpertReadPlan& at = layout_.plan(k / n_experts_, k % n_experts_);
    const ExpertWeights w =
        expert_views(config_, slot_memory_.data() + static_cast<size_t>(v) * slot_bytes_, at.part_offsets);
    int64_t index = 0;
    problem = expert_scale_problem(config_, k / n_experts_, k % n_experts_, w, &part, &index);
    if (!problem.empty()) {
      // Blame the copy whose piece holds the bad byte.
      const uint64_t byte = at.part_offsets[part] + static_cast<uint64_t>(index);
      for (const Piece& p : pieces)
        if (byte >= p.slot_offset && byte < p.slot_offset + p.length) bad_copy = p.copy;
      if (bad_copy < 0) bad_copy = pieces.front().copy;  // (every byte of the slot's parts is in a piece)
      problem = fmt::format("{}: {}", *files_->fds(bad_copy).path, problem);
    }
  }

  Submissions out;
  std::unique_lock<std::mutex> lock(mutex_);
  Slot& s = slots_[v];
  stats_.read_requests += outcome.requests;
  pieces_done(s, bad_copy < 0 && !retry);
  bool again = false;
  if (bad_copy >= 0 || (retry && s.retries >= kMaxRetries)) {
    if (bad_copy < 0) problem = "the shard kept changing while it was read";
    if (bad_copy >= 0) s.bad_copies.push_back(bad_copy);
    s.failures += (s.failures.empty() ? "" : "; then ") + problem;
    again = bad_copy >= 0 && issue(v, out);  // another copy, if one is left
    if (again) ++stats_.read_retries;
  } else if (retry) {
    ++s.retries;
    again = issue(v, out);
    ++stats_.read_retries;
  }
  if (!again) {
    finish_read(s);
    if (bad_copy >= 0 || retry) {
      s.state = State::kFailed;
      s.error = fmt::format("{}: {}", expert_name(k), s.failures);
      ++stats_.read_failures;
    } else {
      const ExpertReadPlan& plan = layout_.plan(k / n_experts_, k % n_experts_);
      s.state = State::kReady;
      s.fresh = true;
      ++stats_.reads;
      stats_.bytes_read += plan.read_bytes - s.shared_bytes;
      stats_.read_windows += plan.windows.size();
      failed_.erase(k);
    }
    pump(out);
  }
  lock.unlock();
  if (!again) ready_.notify_all();
  submit(out);
}

void ExpertStore::prefetch(int layer, std::span<const int> experts) {
  Submissions out;
  std::unique_lock<std::mutex> lock(mutex_);
  ++epoch_;  // reservations of the previous prefetch end here
  want_needed_.clear();
  for (int e : experts) {
    check_key(layer, e);
    const int32_t k = key(layer, e);
    if (slot_of_[k] >= 0) {
      slots_[slot_of_[k]].reserved_epoch = epoch_;
    } else {
      want_needed_.push_back(k);
    }
  }
  // The layer's routing is known now: its guesses still queued are moot, and those it does
  // not need were wrong: evict them first, so a bad guess costs one read but never pushes a
  // useful expert out of the cache.
  auto of_layer = [&](int32_t k) { return k / n_experts_ == layer; };
  std::erase_if(want_predicted_, of_layer);
  std::erase_if(want_expected_, of_layer);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.unused_prediction && s.key / n_experts_ == layer && !reserved(s) && s.state != State::kLoading)
      policy_.demoted(static_cast<int>(i));
  }
  pump(out);
  lock.unlock();
  submit(out);
}

void ExpertStore::predict(int layer, std::span<const int> experts) {
  if (!options_.predict) return;
  Submissions out;
  std::unique_lock<std::mutex> lock(mutex_);
  want_predicted_.clear();
  for (int e : experts) {
    check_key(layer, e);
    if (slot_of_[key(layer, e)] < 0) want_predicted_.push_back(key(layer, e));
  }
  pump(out);
  lock.unlock();
  submit(out);
}

void ExpertStore::expect(int layer, std::span<const int> experts) {
  if (!options_.predict) return;
  Submissions out;
  std::unique_lock<std::mutex> lock(mutex_);
  // Replace this layer's list, keeping the queue in layer order (the order of need).
  std::erase_if(want_expected_, [&](int32_t k) { return k / n_experts_ == layer; });
  auto at = std::find_if(want_expected_.begin(), want_expected_.end(),
                         [&](int32_t k) { return k / n_experts_ > layer; });
  std::vector<int32_t> keys;
  for (int e : experts) {
    check_key(layer, e);
    const int32_t k = key(layer, e);
    if (slot_of_[k] < 0 && std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  want_expected_.insert(at, keys.begin(), keys.end());
  pump(out);
  lock.unlock();
  submit(out);
}

bool ExpertStore::ready(int layer, int expert) const {
  check_key(layer, expert);
  std::lock_guard<std::mutex> lock(mutex_);
  const int v = slot_of_[key(layer, expert)];
  return v >= 0 && slots_[v].state != State::kLoading;
}

const ExpertWeights& ExpertStore::acquire(int layer, int expert) {
  check_key(layer, expert);
  std::unique_lock<std::mutex> lock(mutex_);
  ++stats_.requests;
  const int32_t k = key(layer, expert);
  int v = slot_of_[k];
  if (v < 0) {
    // Nobody asked for it in advance: read it now, ahead of queued guesses.
    auto queued = std::find(want_needed_.begin(), want_needed_.end(), k);
    if (queued != want_needed_.end()) want_needed_.erase(queued);
    for (;;) {
      v = find_victim(false);
      if (v < 0) v = find_victim(true);
      if (v >= 0) break;
      if (loading_ == 0) fail("expert store: all {} expert slots are pinned; cannot load expert {} of layer {}",
                              slots_.size(), expert, layer);
      ready_.wait(lock);  // a read in flight will free up a slot
    }
    Submissions out;
    start_read(v, k, Origin::kDemand, out);
    slots_[v].reserved_epoch = epoch_;  // protect it from the read queue's pump while we wait
    lock.unlock();
    submit(out);
    lock.lock();
  }
  Slot& s = slots_[v];
  s.reserved_epoch = epoch_;
  if (s.state == State::kLoading) {
    ++stats_.stalls;
    const double t0 = now_seconds();
    ready_.wait(lock, [&] { return s.state != State::kLoading; });
    stats_.blocked_seconds += now_seconds() - t0;
  }
  if (s.state == State::kFailed) {
    // This request fails; the slot is freed, so the next request reads the expert again.
    const std::string error = s.error;
    failed_[k] = error;
    slot_of_[k] = -1;
    s.key = -1;
    s.state = State::kFree;
    policy_.freed(v);
    s.reserved_epoch = 0;
    if (s.unused_prediction) {
      s.unused_prediction = false;
      --predicted_unused_slots_;
    }
    throw Error(error);
  }
  if (s.fresh) {
    ++stats_.misses;
    s.fresh = false;
  } else {
    ++stats_.hits;
  }
  if (s.unused_prediction) {
    s.unused_prediction = false;
    --predicted_unused_slots_;
  }
  ++s.pins;
  s.reserved_epoch = 0;
  policy_.used(v, k);
  return s.weights;
}

void ExpertStore::release(int layer, int expert) {
  check_key(layer, expert);
  Submissions out;
  std::unique_lock<std::mutex> lock(mutex_);
  const int v = slot_of_[key(layer, expert)];
  if (v < 0 || slots_[v].pins == 0) fail("expert store: release of expert {} of layer {}, which is not acquired", expert, layer);
  Slot& s = slots_[v];
  --s.pins;
  policy_.released(v);
  pump(out);
  lock.unlock();
  submit(out);
}

ExpertStats ExpertStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpertStats s = stats_;
  const double now = now_seconds();
  if (loading_ > 0) s.read_seconds += now - busy_since_;
  for (size_t f = 0; f < folder_in_flight_.size(); ++f)
    if (folder_in_flight_[f] > 0) s.folder_busy_seconds[f] += now - folder_busy_since_[f];
  return s;
}

uint64_t ExpertStore::resident_bytes() const { return slot_memory_.size(); }

std::string ExpertStore::storage_problem() {
  std::vector<std::string> problems = files_->check_all();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_.empty())
      problems.push_back(fmt::format("{} expert{} failed to load for a request and {} not been read since ({})",
                                     failed_.size(), failed_.size() == 1 ? "" : "s",
                                     failed_.size() == 1 ? "has" : "have", failed_.begin()->second));
  }
  std::string line;
  for (const std::string& p : problems) line += (line.empty() ? "" : "; ") + p;
  return line;
}

}  // namespace dsv4
