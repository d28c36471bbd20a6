// Continuous batching: forward() calls from several threads (server slots, benchmark streams)
// share passes over the weights. Each chunk a thread feeds becomes a request in a queue; one
// waiting thread at a time leads: it waits (briefly) until every member has queued, takes
// the queue's requests in arrival order into one pass, runs it, and wakes their threads. No
// thread owns the batch; the leader is whoever is waiting when no pass runs.
#include <algorithm>
#include <chrono>

#include "dsv4/model/engine.h"

namespace dsv4 {

// How many times batch_wait_us the leader waits for a session of the previous pass.
constexpr int kReturningWaitFactor = 5;

struct Engine::BatchRequest {
  BatchItem item;        // the rows still to run
  bool prefill = false;  // several rows without an undo log: a prompt chunk
  int64_t take = 0;      // rows of item in the pass being run (fewer: a prompt chunk split)
  bool done = false;
  std::exception_ptr error;
};

Engine::BatchMember::BatchMember(Engine* engine) : engine_(engine) {
  int members;
  {
    std::lock_guard<std::mutex> lock(engine_->batch_mutex_);
    members = ++engine_->batch_members_;
  }
  engine_->reserve_batch_undo(members);
}

// Joining is admission; the passes after it are the steady state and must not allocate. So
// the logs a pass of every member needs are reserved here, not by the first pass that is that
// wide: with a thread finishing its warm-up early, the first pass of all members may come
// long after the others have settled (seen as 2 allocations in a 4-thread decode run). Waits
// for a pass in flight (the logs are the pass's).
void Engine::reserve_batch_undo(int parts) {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  const size_t n = std::min(static_cast<size_t>(parts), batch_undo_.size());
  for (size_t i = 0; i < n; ++i) batch_undo_log(i);
}

// Part i's log, reserved once: a decode row's or an admitted chunk's log never grows past
// batch_undo_size_. Callers hold forward_mutex_.
UndoLog& Engine::batch_undo_log(size_t i) {
  if (!batch_undo_ready_[i]) {
    batch_undo_[i].reserve(batch_undo_size_);
    batch_undo_ready_[i] = 1;
  }
  return batch_undo_[i];
}

Engine::BatchMember& Engine::BatchMember::operator=(BatchMember&& o) noexcept {
  if (this != &o) {
    leave();
    engine_ = std::exchange(o.engine_, nullptr);
  }
  return *this;
}

void Engine::BatchMember::leave() {
  if (!engine_) return;
  {
    std::lock_guard<std::mutex> lock(engine_->batch_mutex_);
    --engine_->batch_members_;
  }
  engine_->batch_cv_.notify_all();  // a leader waiting for this member stops waiting
  engine_ = nullptr;
}

void Engine::forward_chunk(const BatchItem& item) {
  bool batching;
  {
    std::lock_guard<std::mutex> lock(batch_mutex_);
    batching = batch_members_ > 0 || !batch_queue_.empty() || batch_leading_;
  }
  if (!batching) {
    std::lock_guard<std::mutex> lock(forward_mutex_);
    run_pass(std::span<const BatchItem>(&item, 1));
    return;
  }
  forward_batched(item);
}

void Engine::forward_batched(const BatchItem& item) {
  BatchRequest request;
  request.item = item;
  request.item.cancel = nullptr;  // a pass shared with other sessions is never abandoned for one
  request.prefill = item.tokens.size() > 1 && item.undo == nullptr;
  std::unique_lock<std::mutex> lock(batch_mutex_);
  batch_queue_.push_back(&request);
  batch_cv_.notify_all();
  while (!request.done) {
    if (batch_leading_) {
      batch_cv_.wait(lock);
      continue;
    }
    batch_leading_ = true;
    lead_batch(lock);  // may run a pass without this request (it did not fit)
    batch_leading_ = false;
    batch_cv_.notify_all();
  }
  lock.unlock();
  if (request.error) std::rethrow_exception(request.error);
}

// Called with the lock held and batch_leading_ set; returns with the lock held.
void Engine::lead_batch(std::unique_lock<std::mutex>& lock) {
  // A session of the previous pass that has not queued again (and whose thread has not left)
  // would miss this pass: its stream would wait two passes for a token
  // (PassCounts::returns_missed). Its thread is only taking its token (argmax, a sample, a
  // write), so it is waited for longer than a newcomer: on a loaded 2-vCPU VM about 1 % of
  // the wake-ups took over batch_wait_us (5 ms), and those missed passes were the streams'
  // p99 while a prompt was admitted.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::microseconds(options_.batch_wait_us);
  const auto returning_deadline = start + std::chrono::microseconds(kReturningWaitFactor * options_.batch_wait_us);
  auto returning_missing = [&] {
    return static_cast<int>(batch_queue_.size()) < batch_members_ &&
           std::any_of(batch_returning_.begin(), batch_returning_.end(), [&](const SessionState* s) {
             return std::none_of(batch_queue_.begin(), batch_queue_.end(),
                                 [&](const BatchRequest* r) { return r->item.session == s; });
           });
  };
  while (static_cast<int>(batch_queue_.size()) < batch_members_) {
    const auto until = returning_missing() ? returning_deadline : deadline;
    if (std::chrono::steady_clock::now() >= until) break;
    batch_cv_.wait_until(lock, until);
  }
  if (batch_queue_.empty()) return;
  if (returning_missing()) ++batch_returns_missed_;
  // In arrival order while the rows fit; a second prompt chunk waits for the next pass (it
  // keeps its place), so each pass carries at most one, and prompts take turns. Beside other
  // rows a prompt chunk gives the pass only its first batch_prompt_rows rows; its rest stays
  // first in the queue.
  const bool others =
      std::any_of(batch_queue_.begin(), batch_queue_.end(), [](const BatchRequest* r) { return !r->prefill; });
  batch_taken_.clear();
  int64_t rows = 0;
  bool prefill = false;
  auto it = batch_queue_.begin();
  while (it != batch_queue_.end()) {
    BatchRequest* r = *it;
    int64_t n = static_cast<int64_t>(r->item.tokens.size());
    if (r->prefill && others) n = std::min(n, std::max<int64_t>(1, options_.batch_prompt_rows));
    if (rows + n > workspace_.max_rows) break;
    const bool twice = std::any_of(batch_taken_.begin(), batch_taken_.end(),
                                   [&](const BatchRequest* t) { return t->item.session == r->item.session; });
    if ((r->prefill && prefill) || twice) {
      ++it;
      continue;
    }
    r->take = n;
    batch_taken_.push_back(r);
    rows += n;
    prefill = prefill || r->prefill;
    it = batch_queue_.erase(it);
  }
  lock.unlock();
  run_requests(batch_taken_);
  lock.lock();
  batch_returning_.clear();
  for (BatchRequest* r : batch_taken_) {
    BatchItem& item = r->item;
    if (r->error || r->take == static_cast<int64_t>(item.tokens.size())) {
      r->done = true;
      batch_returning_.push_back(item.session);
      continue;
    }
    // The rest of a split prompt chunk: first in the queue, the next pass goes on with it.
    if (item.logits && item.rows == LogitRows::kAll) item.logits += r->take * config().vocab_size;
    item.tokens = item.tokens.subspan(static_cast<size_t>(r->take));
    batch_queue_.insert(batch_queue_.begin(), r);
  }
}

// The part of a request's rows in this pass: its first `take` rows (the logits of a kLast
// request only with its last row).
static BatchItem pass_part(const BatchItem& item, int64_t take) {
  BatchItem part = item;
  if (take == static_cast<int64_t>(part.tokens.size())) return part;
  part.tokens = part.tokens.first(static_cast<size_t>(take));
  if (part.rows == LogitRows::kLast) part.logits = nullptr;
  return part;
}

void Engine::run_requests(std::span<BatchRequest* const> requests) {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  if (requests.size() == 1) {
    const BatchItem part = pass_part(requests[0]->item, requests[0]->take);
    try {
      run_pass(std::span<const BatchItem>(&part, 1));
    } catch (...) {
      requests[0]->error = std::current_exception();
    }
    return;
  }
  // Every session's writes are logged, so that a failed pass can be taken back in all of
  // them and each request rerun alone: the fault then costs only its own request.
  batch_items_.clear();
  batch_start_.clear();
  for (size_t i = 0; i < requests.size(); ++i) {
    BatchItem item = pass_part(requests[i]->item, requests[i]->take);
    batch_start_.push_back(item.session->position);
    if (!item.undo) {
      // join_batch has reserved these for its members; a pass with callers that did not
      // join may reserve one here.
      item.undo = &batch_undo_log(i);
      item.undo->begin(*item.session);
    }
    batch_items_.push_back(item);
  }
  std::exception_ptr failure;
  try {
    run_pass(batch_items_);
    return;
  } catch (...) {
    failure = std::current_exception();
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    BatchRequest& r = *requests[i];
    const BatchItem& item = batch_items_[i];
    UndoLog& undo = *item.undo;
    if (undo.start_position() != batch_start_[i]) {
      // The caller's own log holds earlier positions: it rewinds the session itself.
      r.error = failure;
      continue;
    }
    undo.rewind(*item.session, batch_start_[i]);
    try {
      run_pass(std::span<const BatchItem>(&item, 1));
    } catch (...) {
      r.error = std::current_exception();
      // Our own log: the failed request's session goes back to before the pass.
      if (!r.item.undo) undo.rewind(*item.session, batch_start_[i]);
    }
  }
}

}  // namespace dsv4
