#include "dsv4/experts/expert_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "dsv4/io/checkpoint.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

IoBackend parse_io_backend(const std::string& text) {
  if (text == "auto") return IoBackend::kAuto;
  if (text == "uring" || text == "io_uring") return IoBackend::kUring;
  if (text == "threads") return IoBackend::kThreads;
  fail("--io \"{}\": expected auto, uring or threads", text);
}

ExpertStore::ExpertStore(const Checkpoint& ck, const ExpertStoreOptions& options)
    : options_(options), layout_(ck), n_experts_(layout_.n_experts()), config_(ck.config()) {
  if (options_.slots < 1) fail("expert store: needs at least one slot, got {}", options_.slots);
  if (options_.queue_depth < 1) fail("expert store: queue depth must be at least 1");
  slot_bytes_ = layout_.slot_bytes();

  std::string refused;
  for (const std::string& path : layout_.shard_paths()) {
    Shard s;
    s.path = path;
    s.buffered = File::open_read(path);
    if (options_.direct_io) s.direct = File::open_direct(path);
    s.use_direct = s.direct.valid();
    if (options_.direct_io && !s.use_direct && refused.empty()) refused = path;
    shards_.push_back(std::move(s));
  }
  if (!refused.empty()) note_buffered(refused);

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

  auto done = [this](uint64_t slot, const ReadOutcome& outcome) { on_read_done(slot, outcome); };
  if (options_.backend != IoBackend::kThreads) queue_ = make_uring_read_queue(options_.queue_depth, done);
  if (!queue_) {
    if (options_.backend == IoBackend::kUring) fail("expert store: io_uring is not available here");
    queue_ = make_thread_read_queue(options_.queue_depth, done);
  }
}

ExpertStore::~ExpertStore() {
  queue_->stop();  // waits for reads in flight (they write into the slots); the queue stays valid meanwhile
}

void ExpertStore::note_buffered(const std::string& path) {
  if (warned_buffered_ || options_.quiet) return;
  warned_buffered_ = true;
  std::fprintf(stderr, "dsv4: note: %s refuses O_DIRECT; routed experts are read through the page cache\n",
               path.c_str());
}

bool ExpertStore::direct_io() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Shard& s : shards_)
    if (!s.use_direct) return false;
  return true;
}

void ExpertStore::check_key(int layer, int expert) const {
  if (layer < 0 || layer >= layout_.n_layers() || expert < 0 || expert >= n_experts_)
    fail("expert store: expert {} of layer {} does not exist", expert, layer);
}

bool ExpertStore::evictable(const Slot& s, bool allow_reserved) const {
  return s.pins == 0 && s.state != State::kLoading && (allow_reserved || !reserved(s));
}

int ExpertStore::find_victim(bool allow_reserved) const {
  int best = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == State::kFree) return static_cast<int>(i);
    if (evictable(s, allow_reserved) && (best < 0 || s.last_use < slots_[best].last_use)) best = static_cast<int>(i);
  }
  return best;
}

void ExpertStore::submit(Submissions& out) {
  for (Submission& s : out) queue_->submit(s.slot, std::move(s.ops));
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
  s.unused_prediction = origin == Origin::kPredict;
  s.error.clear();
  s.last_use = ++clock_;
  slot_of_[k] = v;
  if (origin == Origin::kPredict) {
    ++stats_.predicted_reads;
    ++predicted_unused_slots_;
    ++loading_predicted_;
  }
  if (origin == Origin::kDemand) ++stats_.demand_reads;

  const ExpertReadPlan& plan = layout_.plan(k / n_experts_, k % n_experts_);
  uint8_t* base = slot_memory_.data() + static_cast<size_t>(v) * slot_bytes_;
  std::vector<ReadOp> ops;
  for (const ReadWindow& w : plan.windows) {
    const Shard& sh = shards_[w.shard];
    ReadOp op;
    op.fd = sh.use_direct ? sh.direct.fd() : sh.buffered.fd();
    op.buffered_fd = sh.buffered.fd();
    op.shard = w.shard;
    op.path = &sh.path;
    op.offset = w.file_offset;
    op.length = w.length;
    op.needed = w.needed;
    op.dst = base + w.slot_offset;
    ops.push_back(op);
  }
  s.weights = expert_views(config_, base, plan.part_offsets);
  if (loading_++ == 0) busy_since_ = now_seconds();
  out.push_back({static_cast<uint64_t>(v), std::move(ops)});
}

void ExpertStore::pump(Submissions& out) {
  // Needed experts first, in the order they will be acquired. Only queue_depth reads are
  // handed to the queue at a time, so a later, more urgent request never waits behind a
  // long list of queued guesses.
  while (!want_needed_.empty() && loading_ < options_.queue_depth) {
    const int32_t k = want_needed_.front();
    if (slot_of_[k] >= 0) {
      want_needed_.pop_front();
      continue;
    }
    const int v = find_victim(false);
    if (v < 0) break;
    want_needed_.pop_front();
    start_read(v, k, Origin::kPrefetch, out);
    slots_[v].reserved_epoch = epoch_;
  }
  if (!want_needed_.empty()) return;
  const int cap = options_.max_predicted_slots >= 0 ? options_.max_predicted_slots
                                                     : std::max<int>(1, static_cast<int>(slots_.size() / 2));
  const bool idle_only = options_.max_predicted_in_flight >= 0;
  if (idle_only && loading_ > loading_predicted_) return;  // a needed read is in flight
  const int max_guesses = idle_only ? options_.max_predicted_in_flight : options_.queue_depth;
  while (!want_predicted_.empty() && loading_ < options_.queue_depth && loading_predicted_ < max_guesses &&
         predicted_unused_slots_ < cap) {
    const int32_t k = want_predicted_.front();
    if (slot_of_[k] >= 0) {
      want_predicted_.pop_front();
      continue;
    }
    const int v = find_victim(false);
    if (v < 0) break;
    want_predicted_.pop_front();
    start_read(v, k, Origin::kPredict, out);
  }
}

void ExpertStore::on_read_done(uint64_t v, const ReadOutcome& outcome) {
  Submissions out;
  std::unique_lock<std::mutex> lock(mutex_);
  if (--loading_ == 0) stats_.read_seconds += now_seconds() - busy_since_;
  if (slots_[v].origin == Origin::kPredict) --loading_predicted_;
  for (int shard : outcome.refused_direct) {
    shards_[shard].use_direct = false;
    note_buffered(shards_[shard].path);
  }
  Slot& s = slots_[v];
  if (outcome.error.empty()) {
    const ExpertReadPlan& plan = layout_.plan(s.key / n_experts_, s.key % n_experts_);
    s.state = State::kReady;
    s.fresh = true;
    ++stats_.reads;
    stats_.bytes_read += plan.read_bytes;
  } else {
    s.state = State::kFailed;
    s.error = outcome.error;
  }
  pump(out);
  lock.unlock();
  ready_.notify_all();
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
  std::erase_if(want_predicted_, [&](int32_t k) { return k / n_experts_ == layer; });
  for (Slot& s : slots_) {
    if (s.unused_prediction && s.key / n_experts_ == layer && !reserved(s) && s.state != State::kLoading)
      s.last_use = 0;
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
    const std::string error = s.error;
    slot_of_[k] = -1;
    s.key = -1;
    s.state = State::kFree;
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
  s.last_use = ++clock_;
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
  s.last_use = ++clock_;
  pump(out);
  lock.unlock();
  submit(out);
}

ExpertStats ExpertStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpertStats s = stats_;
  if (loading_ > 0) s.read_seconds += now_seconds() - busy_since_;
  return s;
}

uint64_t ExpertStore::resident_bytes() const { return slot_memory_.size(); }

}  // namespace dsv4
