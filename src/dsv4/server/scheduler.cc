#include "dsv4/server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "dsv4/text/utf8.h"
#include "dsv4/util/error.h"

namespace dsv4::server {
namespace {

// Prompts with at least this many tokens left to prefill also keep a snapshot one token short
// of their end (a pass of its own for the last token).
constexpr size_t kPromptSnapshotMin = 64;
// A snapshot where a prompt parts from a cached one (no pass of its own: the prefill's chunk is
// only cut there) once it saves at least this many tokens of the next such prompt's prefill.
constexpr size_t kForkSnapshotMin = 16;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The index of the token of `ids` whose bytes begin at byte `at` (offsets: token_offsets(ids)).
std::optional<size_t> token_at(std::span<const size_t> offsets, size_t at) {
  const auto it = std::lower_bound(offsets.begin(), offsets.end() - 1, at);
  if (it == offsets.end() - 1 || *it != at) return std::nullopt;
  return static_cast<size_t>(it - offsets.begin());
}

// Where the added tokens of `ids` are, by the byte of their decoded text each begins at (the
// text between them is repaired to valid UTF-8 as decode() does; an added token is valid UTF-8
// and starts a character, so each stretch is repaired on its own).
std::vector<std::pair<size_t, int32_t>> added_tokens(const text::Tokenizer& t, std::span<const int32_t> ids) {
  std::vector<std::pair<size_t, int32_t>> out;
  std::string stretch;
  size_t at = 0;
  for (int32_t id : ids) {
    if (!t.is_added(id)) {
      stretch += t.token_bytes(id);
      continue;
    }
    at += text::to_valid_utf8(stretch).size();
    stretch.clear();
    out.emplace_back(at, id);
    at += t.token_bytes(id).size();
  }
  return out;
}

std::unique_ptr<PrefixStore> open_store(const Engine& engine, const SchedulerOptions& o) {
  if (o.cache_dir.empty()) return nullptr;
  PrefixStore::Warn warn = o.cache_warn ? o.cache_warn : [](const std::string& m) {
    fmt::print(stderr, "dsv4 serve: prefix cache: {}\n", m);
  };
  StoreLimits limits{static_cast<int64_t>(engine.config().layers.size()), engine.config().vocab_size};
  const SessionState fresh = engine.new_session();
  limits.mtp_streams = fresh.mtp.streams.size();
  limits.mtp_positions = fresh.mtp.stream_position.size();
  return std::make_unique<PrefixStore>(o.cache_dir, o.cache_dir_bytes, store_identity(engine), limits, std::move(warn));
}

// Adds what a prefill stage before the answer cost to `total`.
void add_prefill(GenerationStats& total, const GenerationStats& stage) {
  total.prefill_s += stage.prefill_s;
  total.prefilled_tokens += stage.prefilled_tokens;
  total.expert_requests += stage.expert_requests;
  total.expert_hits += stage.expert_hits;
  total.bytes_read += stage.bytes_read;
}

}  // namespace

void ForkPoint::open() {
  {
    std::lock_guard lock(mu_);
    open_ = true;
  }
  cv_.notify_all();
}

void ForkPoint::wait(const std::atomic<bool>& cancel) {
  std::unique_lock lock(mu_);
  // A cancellation does not notify this: it is looked at every few milliseconds.
  while (!open_ && !cancel.load()) cv_.wait_for(lock, std::chrono::milliseconds(10));
}

bool Job::wait(std::chrono::milliseconds timeout, std::string& text) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !text_.empty(); });
  text += text_;
  text_.clear();
  return finished_;
}

std::vector<TokenLogprob> Job::take_logprobs() {
  std::lock_guard lock(mu_);
  return std::exchange(logprobs_, {});
}

std::optional<JobStart> Job::started() {
  std::lock_guard lock(mu_);
  return started_;
}

Scheduler::Scheduler(Engine& engine, const text::Tokenizer& tokenizer, Metrics& metrics, SchedulerOptions options)
    : engine_(engine),
      tokenizer_(tokenizer),
      metrics_(metrics),
      options_(options),
      // The sessions hold engine.context_limit() tokens (what the plan reserved), not the
      // model's max_position_embeddings: admitting against the latter let a longer prompt in
      // and fail mid-prefill with a 500 or an error event after a 200.
      context_limit_(options.context_limit > 0 ? std::min(options.context_limit, engine.context_limit())
                                               : engine.context_limit()),
      cache_(options.cache_entries, options.cache_bytes, open_store(engine, options)) {
  metrics_.set_expert_stats(engine_.experts().stats());
  options_.parallel = std::max(1, options_.parallel);
  running_.resize(static_cast<size_t>(options_.parallel));
  for (int i = 0; i < options_.parallel; ++i) workers_.emplace_back([this, i] { worker_loop(static_cast<size_t>(i)); });
}

size_t Scheduler::running_count() const {
  return static_cast<size_t>(std::count_if(running_.begin(), running_.end(), [](const auto& j) { return j != nullptr; }));
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::Reservation::release() {
  if (!scheduler_) return;
  std::lock_guard lock(scheduler_->mu_);
  --scheduler_->reserved_;
  scheduler_ = nullptr;
}

Scheduler::Admission Scheduler::reserve() {
  std::lock_guard lock(mu_);
  if (stopping_) return {Reservation(), true};
  // `parallel` generations run and max_queue wait; a request being read counts as waiting.
  const size_t admitted = running_count() + queue_.size() + reserved_;
  if (admitted >= options_.max_queue + static_cast<size_t>(options_.parallel)) return {Reservation(), false};
  ++reserved_;
  return {Reservation(this), false};
}

std::shared_ptr<Job> Scheduler::submit(Reservation slot, JobInput input, std::function<void()> on_news) {
  std::vector<JobInput> one;
  one.push_back(std::move(input));
  std::vector<std::shared_ptr<Job>> jobs = submit_choices(std::move(slot), std::move(one), std::move(on_news));
  return jobs.empty() ? nullptr : jobs.front();
}

std::vector<std::shared_ptr<Job>> Scheduler::submit_choices(Reservation slot, std::vector<JobInput> choices,
                                                            std::function<void()> on_news) {
  if (slot.scheduler_ != this) fail("Scheduler::submit: the reservation is not this scheduler's");
  std::lock_guard lock(mu_);
  slot.scheduler_ = nullptr;  // the place passes to the jobs
  --reserved_;
  if (stopping_) return {};
  // Queued one after another, so the first choice (which prefills for the others) starts
  // first: no choice waits for one that has no slot.
  auto fork = choices.size() > 1 ? std::make_shared<ForkPoint>() : nullptr;
  std::vector<std::shared_ptr<Job>> jobs;
  for (size_t i = 0; i < choices.size(); ++i) {
    auto job = std::make_shared<Job>(std::move(choices[i]), on_news);
    job->fork_ = fork;
    job->fork_leader_ = fork && i == 0;
    queue_.push_back(job);
    jobs.push_back(std::move(job));
  }
  cv_.notify_all();
  return jobs;
}

Scheduler::Submitted Scheduler::submit(JobInput input) {
  Admission a = reserve();
  if (!a.slot) return {nullptr, a.shutting_down};
  std::shared_ptr<Job> job = submit(std::move(a.slot), std::move(input));
  return {job, job == nullptr};
}

void Scheduler::cancel(const std::shared_ptr<Job>& job) {
  job->cancel_.store(true);
  std::lock_guard lock(mu_);
  auto it = std::find(queue_.begin(), queue_.end(), job);
  if (it != queue_.end()) {
    queue_.erase(it);
    finish(*job, JobOutcome::Status::kCancelled);
  }
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      for (auto& job : queue_) finish(*job, JobOutcome::Status::kShutdown, "the server is shutting down");
      queue_.clear();
      for (auto& job : running_)
        if (job) job->cancel_.store(true);
    }
  }
  cv_.notify_all();
  for (std::thread& w : workers_)
    if (w.joinable()) w.join();
}

SchedulerGauges Scheduler::gauges() const {
  std::lock_guard lock(mu_);
  return {queue_.size() + reserved_, running_count() > 0, cache_entries_, cache_bytes_, running_count(),
          static_cast<size_t>(options_.parallel)};
}

int Scheduler::retry_after_s() const {
  std::lock_guard lock(mu_);
  const double wait = average_job_s_ * static_cast<double>(queue_.size() + reserved_ + 1) / options_.parallel;
  return static_cast<int>(std::clamp(std::ceil(wait), 1.0, 3600.0));
}

void Scheduler::finish(Job& job, JobOutcome::Status status, std::string error) {
  {
    std::lock_guard lock(job.mu_);
    job.outcome_.status = status;
    job.outcome_.error = std::move(error);
    job.finished_ = true;
    job.cv_.notify_all();
  }
  if (job.fork_leader_) job.fork_->open();  // ended before its prompt snapshot: the others go alone
  job.notify();
}

void Scheduler::worker_loop(size_t slot) {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;  // stop() already finished the queued jobs
      job = std::move(queue_.front());
      queue_.pop_front();
      running_[slot] = job;
    }
    const auto start = Clock::now();
    {
      // A later choice of an n > 1 request starts once the first has left its prompt's
      // snapshot; it waits outside the batch, whose shared passes would wait for its rows.
      if (job->fork_ && !job->fork_leader_) job->fork_->wait(job->cancel_);
      // While it generates, this slot's passes are shared with the other slots'.
      Engine::BatchMember member = options_.parallel > 1 ? engine_.join_batch() : Engine::BatchMember();
      run(*job);
    }
    size_t entries = 0;
    uint64_t bytes = 0;
    {
      // The answer is out: now write this request's snapshots to the disk tier.
      std::lock_guard cache_lock(cache_mu_);
      try {
        cache_.persist();
      } catch (const std::exception& e) {
        fmt::print(stderr, "dsv4 serve: prefix cache: not written: {}\n", e.what());
      }
      entries = cache_.entries();
      bytes = cache_.bytes();
    }
    metrics_.set_expert_stats(engine_.experts().stats());
    std::lock_guard lock(mu_);
    running_[slot].reset();
    average_job_s_ = 0.7 * average_job_s_ + 0.3 * seconds_between(start, Clock::now());
    cache_entries_ = entries;
    cache_bytes_ = bytes;
  }
}

void Scheduler::store_snapshot(const SessionState& s, std::span<const int32_t> tail) {
  // The decoded text lets a later prompt match by text when its tokenization differs from
  // the tokens the model generated (see run()).
  std::vector<int32_t> key = s.tokens;
  key.insert(key.end(), tail.begin(), tail.end());
  std::string text = tokenizer_.decode(key);
  std::lock_guard lock(cache_mu_);
  cache_.insert(s, tail, std::move(text));
}

void Scheduler::run(Job& job) {
  const JobInput& in = job.input_;
  const auto start = Clock::now();
  JobOutcome& out = job.outcome_;  // only this thread writes it until finish()
  out.queue_s = seconds_between(in.arrival, start);
  try {
    // Find the longest cached prefix: by tokens, or by text. A conversation's next request
    // repeats the previous answer as text; re-tokenized it need not give the tokens the model
    // generated, but the cached session (which holds those tokens) is still the right
    // history when its text is a prefix of the new prompt, the prompt's tokens have a
    // template's added token (<｜end▁of▁sentence｜>, <｜User｜>, ...) starting right there (the
    // tokenizer never merges across one, so the rest of the prompt's tokens stand on their
    // own), and the cached tokens hold added tokens exactly where the prompt does (a user's
    // text spelling "<｜User｜>" is plain text in the prompt, and must not reuse a history in
    // which those bytes were the control token).
    std::vector<int32_t> prompt = in.prompt;
    const std::vector<size_t> offsets = in.prompt_text.empty() ? std::vector<size_t>() : tokenizer_.token_offsets(in.prompt);
    std::unique_lock cache_lock(cache_mu_);
    auto match = cache_.longest_token_prefix(prompt);
    // Where the prompt parts from the nearest cached one (by tokens).
    size_t parts_at = cache_.longest_shared_prefix(prompt);
    if (!in.prompt_text.empty()) {
      auto junction = [&](std::string_view rest) { return token_at(offsets, in.prompt_text.size() - rest.size()); };
      auto junction_ok = [&](std::string_view rest) {
        const auto at = junction(rest);
        return at && *at < in.prompt.size() && tokenizer_.is_added(in.prompt[*at]);
      };
      auto by_text = cache_.longest_text_prefix(in.prompt_text, junction_ok);
      if (by_text && (!match || by_text->state.tokens.size() > match->state.tokens.size())) {
        const size_t at = *junction(std::string_view(in.prompt_text).substr(by_text->text.size()));
        std::vector<int32_t> alt = by_text->key;
        alt.insert(alt.end(), in.prompt.begin() + static_cast<ptrdiff_t>(at), in.prompt.end());
        if (static_cast<int64_t>(alt.size()) < context_limit_ &&
            added_tokens(tokenizer_, by_text->key) == added_tokens(tokenizer_, std::span(in.prompt).first(at))) {
          prompt = std::move(alt);
          match = std::move(by_text);
          parts_at = cache_.longest_shared_prefix(prompt);
        }
      }
    }
    cache_lock.unlock();
    metrics_.count_cache_lookup(match.has_value());
    SessionState session = match ? std::move(match->state) : engine_.new_session();
    match.reset();
    const int64_t reused = static_cast<int64_t>(session.tokens.size());
    {
      std::lock_guard lock(job.mu_);
      job.started_ = JobStart{static_cast<int64_t>(prompt.size()), reused};
    }

    GenerationRequest req = in.generation;
    req.context_limit = context_limit_;
    req.chunk = options_.chunk;
    req.steer_to_budget = options_.steer_to_budget;
    GenerationCallbacks cb;
    cb.cancel = &job.cancel_;
    cb.snapshot_every = options_.cache_entries > 0 ? options_.cache_block : 0;
    cb.on_snapshot = [&](const SessionState& s) {
      std::lock_guard lock(cache_mu_);
      cache_.insert_block(s);
    };
    GenerationStats prefix_stats;  // the stages before the answer's

    // Prefills the prompt up to `end` and keeps a snapshot there (a request's own, or a block
    // snapshot); false when cancelled.
    auto prefill_to = [&](size_t end, bool block = false) {
      GenerationRequest upto = req;
      upto.prompt.assign(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(end));
      upto.max_tokens = 0;
      upto.constraint = nullptr;
      upto.stop_strings.clear();
      cb.detokenize = [](int32_t) { return std::string(); };
      GenerationResult r = generate(engine_, session, upto, cb);
      add_prefill(prefix_stats, r.stats);
      if (r.finish == FinishReason::kCancelled) {
        out.result = std::move(r);
        finish(job, JobOutcome::Status::kCancelled);
        return false;
      }
      if (block)
        cb.on_snapshot(session);
      else
        store_snapshot(session, {});
      return true;
    };
    // Stage 1: prefill up to the history boundary and keep a snapshot there.
    const size_t boundary = in.history_suffix > 0 && in.history_suffix < prompt.size() ? prompt.size() - in.history_suffix : 0;
    if (boundary > session.tokens.size() && !prefill_to(boundary)) return;
    // Where it parts from a cached prompt past the snapshot it resumes from (the same document
    // with another question: the last block snapshot is up to a block short of the question):
    // a block snapshot there, so the next prompt that agrees this far reuses all of it.
    const size_t prompt_end = prompt.size() - 1;
    if (parts_at >= session.tokens.size() + kForkSnapshotMin && parts_at < prompt_end && !prefill_to(parts_at, true))
      return;
    // The first of several choices: the prompt but its last token (a session must have a token
    // left to feed for the first logits), for the other choices to start from.
    // A long prompt but its last token is kept too, so the same prompt again (a retry, another
    // sample) reuses all of it; a short one costs little to prefill again and is not split.
    if (job.fork_leader_ || prompt_end >= session.tokens.size() + kPromptSnapshotMin) {
      if (prompt_end > session.tokens.size() && !prefill_to(prompt_end)) return;
      if (job.fork_leader_) job.fork_->open();
    }

    // Stage 2: the rest of the prompt and the answer.
    text::IncrementalDecoder decoder(tokenizer_, in.show_special);
    cb.detokenize = [&](int32_t id) {
      if (options_.token_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options_.token_delay_ms));
      return decoder.push(id);
    };
    cb.flush = [&] { return decoder.finish(); };
    cb.on_logprob = [&](const TokenLogprob& lp) {  // the text that follows wakes the handler
      std::lock_guard lock(job.mu_);
      job.logprobs_.push_back(lp);
    };
    cb.on_text = [&](const std::string& t) {
      {
        std::lock_guard lock(job.mu_);
        job.text_ += t;
        job.cv_.notify_all();
      }
      job.notify();
    };
    req.prompt = std::move(prompt);
    const auto answer_start = Clock::now();
    GenerationResult r = generate(engine_, session, req, cb);
    // One set of stats for the whole request (both stages).
    r.stats.reused_tokens = reused;
    r.stats.ttft_s += seconds_between(start, answer_start);
    add_prefill(r.stats, prefix_stats);
    out.ttft_s = out.queue_s + r.stats.ttft_s;
    const bool cancelled = r.finish == FinishReason::kCancelled;
    // The answer's last token was sampled but not fed: it becomes the snapshot's tail, so the
    // next turn (which repeats the answer) matches the whole answer. A cancelled turn leaves
    // the cache as it was before it (only the history snapshot above, if it got that far).
    if (!cancelled) {
      const size_t fed = session.tokens.size() > req.prompt.size() ? session.tokens.size() - req.prompt.size() : 0;
      std::span<const int32_t> tail(r.tokens);
      tail = session.tokens.size() >= req.prompt.size() && fed <= tail.size() ? tail.subspan(fed) : tail.first(0);
      store_snapshot(std::move(session), tail);
    }
    metrics_.observe_generation(r.stats, out.ttft_s, out.queue_s, r.finish);
    out.result = std::move(r);
    finish(job, cancelled ? JobOutcome::Status::kCancelled : JobOutcome::Status::kDone);
  } catch (const std::exception& e) {
    // The session that failed is dropped; the cache only holds snapshots taken before.
    finish(job, JobOutcome::Status::kFailed, e.what());
  }
}

}  // namespace dsv4::server
