// Continuous batching: forward() calls from several threads (server slots, benchmark streams)
// share passes over the weights. Each chunk a thread feeds becomes a request in a queue; one
// waiting thread at a time leads: it waits (briefly) until every member has queued, takes
// the queue's requests in arrival order into one pass, runs it, and wakes their threads. No
// thread owns the batch; the leader is whoever is waiting when no pass runs.
#include <algorithm>
#include <chrono>

#include "dsv4/model/engine.h"

namespace dsv4 {

struct Engine::BatchRequest {
  BatchItem item;
  bool prefill = false;  // several rows without an undo log: a prompt chunk
  bool done = false;
  std::exception_ptr error;
};

Engine::BatchMember::BatchMember(Engine* engine) : engine_(engine) {
  std::lock_guard<std::mutex> lock(engine_->batch_mutex_);
  ++engine_->batch_members_;
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
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(options_.batch_wait_us);
  while (static_cast<int>(batch_queue_.size()) < batch_members_)
    if (batch_cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
  if (batch_queue_.empty()) return;
  // In arrival order while the rows fit; a second prompt chunk waits for the next pass (it
  // keeps its place), so each pass carries at most one, and prompts take turns.
  batch_taken_.clear();
  int64_t rows = 0;
  bool prefill = false;
  auto it = batch_queue_.begin();
  while (it != batch_queue_.end()) {
    BatchRequest* r = *it;
    const int64_t n = static_cast<int64_t>(r->item.tokens.size());
    if (rows + n > workspace_.max_rows) break;
    const bool twice = std::any_of(batch_taken_.begin(), batch_taken_.end(),
                                   [&](const BatchRequest* t) { return t->item.session == r->item.session; });
    if ((r->prefill && prefill) || twice) {
      ++it;
      continue;
    }
    batch_taken_.push_back(r);
    rows += n;
    prefill = prefill || r->prefill;
    it = batch_queue_.erase(it);
  }
  lock.unlock();
  run_requests(batch_taken_);
  lock.lock();
  for (BatchRequest* r : batch_taken_) r->done = true;
}

void Engine::run_requests(std::span<BatchRequest* const> requests) {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  auto alone = [&](BatchRequest& r) {
    try {
      run_pass(std::span<const BatchItem>(&r.item, 1));
    } catch (...) {
      r.error = std::current_exception();
    }
  };
  if (requests.size() == 1) {
    alone(*requests[0]);
    return;
  }
  // Every session's writes are logged, so that a failed pass can be taken back in all of
  // them and each request rerun alone: the fault then costs only its own request.
  batch_items_.clear();
  batch_start_.clear();
  for (size_t i = 0; i < requests.size(); ++i) {
    BatchItem item = requests[i]->item;
    batch_start_.push_back(item.session->position);
    if (!item.undo) {
      if (!batch_undo_ready_[i]) {  // once: a decode row's log never grows past this
        batch_undo_[i].reserve(undo_row_records_, undo_row_floats_);
        batch_undo_ready_[i] = 1;
      }
      batch_undo_[i].begin(*item.session);
      item.undo = &batch_undo_[i];
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
