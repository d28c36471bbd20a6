// One engine, `parallel` worker threads (slots), each running one generation at a time; the
// slots' generations share the engine's passes over the weights (continuous batching,
// Engine::join_batch: each pass advances every decoding slot by one token and carries at most
// one prompt chunk of --chunk rows, so a long prompt delays the others' streams by at most a
// chunk per token), and each gets exactly the tokens it would get alone. Requests wait in a
// FIFO queue of bounded length. A request takes its place in the queue (a Reservation) before its body is
// read, so a full queue refuses at once, before any work (the HTTP layer answers 429); a client
// that goes away cancels its request (a queued one is dropped, a running one stops at the next
// token or prefill chunk, and a cancelled generation leaves no snapshot behind). Before each generation the prefix cache supplies the longest
// session snapshot the prompt extends, and after it the worker stores snapshots for the next
// turn of the conversation: one at the start of the last user turn (the history the next
// request repeats even when it rewrites the answer, as thinking mode does) and one after the
// answer. The n choices of one request (OpenAI's `n`) are n jobs queued together: the first
// prefills the prompt (all of it but the last token) and leaves that snapshot in the prefix
// cache before it generates; the others wait in their slots until it has, then start from it
// as any request starts from a cached prefix, so the prompt is prefilled once and every choice
// is exactly what it would be alone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dsv4/model/engine.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/server/metrics.h"
#include "dsv4/server/prefix_cache.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/runtime/settings.h"

namespace dsv4::server {

using Clock = std::chrono::steady_clock;

struct SchedulerOptions {
  // Defaults from the settings table (--max-queue, --cache-entries, --cache-mb).
  size_t max_queue = setting_default<size_t>("max_queue");  // requests allowed to wait while all slots run
  int parallel = 1;  // slots: generations that run at once (the RAM plan reserves a session for each)
  size_t cache_entries = setting_default<size_t>("cache_entries");  // prefix cache snapshots
  uint64_t cache_bytes = setting_default<uint64_t>("cache_mb") << 20;
  int64_t cache_block = setting_default<int64_t>("cache_block");  // block snapshots every so many tokens (0: none)
  std::string cache_dir;  // the prefix cache's disk tier ("" = none; --cache-dir)
  uint64_t cache_dir_bytes = setting_default<uint64_t>("cache_dir_mb") << 20;
  // Where the disk tier's warnings go (a corrupted entry, a failed write); default stderr.
  std::function<void(const std::string&)> cache_warn;
  int64_t context_limit = 0;             // 0: what a session holds (the engine's context limit)
  int64_t chunk = 0;                     // prefill chunk (0: the generator's default)
  // Test hook (DSV4_TEST_TOKEN_DELAY_MS): pause after each generated token, so browser tests
  // can watch an answer stream and stop it even though a tiny model decodes in microseconds.
  int token_delay_ms = 0;
  // Test hook (DSV4_TEST_UNSTEERED_CONSTRAINTS): GenerationRequest::steer_to_budget; the
  // server then also takes a max_tokens below a constrained answer's minimum.
  bool steer_to_budget = true;
};

struct JobInput {
  std::vector<int32_t> prompt;   // the canonical tokens of the prompt
  std::string prompt_text;       // the text they encode ("" when the client sent token ids)
  size_t history_suffix = 0;     // tokens after the history boundary (0: no boundary)
  // Which generated special tokens the answer's text shows (null: all of them).
  text::IncrementalDecoder::ShowSpecial show_special;
  GenerationRequest generation;  // sampling, max_tokens, stops (prompt, limit, chunk are set here)
  Clock::time_point arrival = Clock::now();
};

struct JobOutcome {
  enum class Status { kDone, kCancelled, kFailed, kShutdown };
  Status status = Status::kDone;
  std::string error;         // kFailed: what went wrong
  GenerationResult result;   // kDone (and kCancelled: what was generated so far)
  double queue_s = 0;        // arrival -> start
  double ttft_s = 0;         // arrival -> first token
};

// What is known once a job starts running (after the prefix cache lookup).
struct JobStart {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;  // supplied by the prefix cache
};

// Where the choices of one request meet: open once the first choice's prompt snapshot is in
// the prefix cache (or that choice has ended without one).
class ForkPoint {
 public:
  void open();
  // Waits until open() or `cancel`.
  void wait(const std::atomic<bool>& cancel);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class Job {
 public:
  // `on_news` (optional) is called from the worker, without locks held, whenever text arrives
  // or the job finishes: an event loop uses it to wake the request's handler.
  explicit Job(JobInput input, std::function<void()> on_news = {})
      : input_(std::move(input)), on_news_(std::move(on_news)) {}
  // Waits up to `timeout` for news. Appends the text generated since the last call to `text`
  // and returns true once the job has finished (then outcome() is valid).
  bool wait(std::chrono::milliseconds timeout, std::string& text);
  // wait() without waiting.
  bool take(std::string& text) { return wait(std::chrono::milliseconds(0), text); }
  // The log-probabilities of the tokens generated since the last call (when requested).
  std::vector<TokenLogprob> take_logprobs();
  // Set once the worker has started the job (before any text arrives).
  std::optional<JobStart> started();
  const JobOutcome& outcome() const { return outcome_; }
  const JobInput& input() const { return input_; }

 private:
  friend class Scheduler;
  void notify() const {
    if (on_news_) on_news_();
  }
  JobInput input_;
  std::function<void()> on_news_;
  std::shared_ptr<ForkPoint> fork_;  // set for the choices of an n > 1 request
  bool fork_leader_ = false;         // the choice that prefills for the others
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  std::vector<TokenLogprob> logprobs_;
  std::optional<JobStart> started_;
  bool finished_ = false;
  JobOutcome outcome_;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const text::Tokenizer& tokenizer, Metrics& metrics, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // A place in the queue, held from before a request's body is read until it becomes a job
  // (or is given back when the request fails before that). Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept : scheduler_(std::exchange(o.scheduler_, nullptr)) {}
    Reservation& operator=(Reservation&& o) noexcept {
      if (this != &o) {
        release();
        scheduler_ = std::exchange(o.scheduler_, nullptr);
      }
      return *this;
    }
    ~Reservation() { release(); }
    explicit operator bool() const { return scheduler_ != nullptr; }
    void release();

   private:
    friend class Scheduler;
    explicit Reservation(Scheduler* s) : scheduler_(s) {}
    Scheduler* scheduler_ = nullptr;
  };
  struct Admission {
    Reservation slot;  // empty: refused
    bool shutting_down = false;
  };
  // Takes a place unless max_queue requests already wait (reserved places count as waiting)
  // or the scheduler is stopping.
  Admission reserve();
  // Turns a reservation into a queued job; null when the scheduler stopped meanwhile.
  std::shared_ptr<Job> submit(Reservation slot, JobInput input, std::function<void()> on_news = {});
  // The choices of one request (the same prompt), queued together on one reservation: one
  // prefill, forked (see above). Empty when the scheduler stopped meanwhile.
  std::vector<std::shared_ptr<Job>> submit_choices(Reservation slot, std::vector<JobInput> choices,
                                                   std::function<void()> on_news = {});

  struct Submitted {
    std::shared_ptr<Job> job;  // null: refused
    bool shutting_down = false;
  };
  // reserve() and submit() in one step.
  Submitted submit(JobInput input);
  // The client is gone: drop the job if it still waits, stop it if it runs.
  void cancel(const std::shared_ptr<Job>& job);
  // Cancels everything and joins the worker; queued jobs finish with kShutdown.
  void stop();

  int64_t context_limit() const { return context_limit_; }
  SchedulerGauges gauges() const;
  // Seconds a refused client should wait before retrying (a rough estimate, at least 1).
  int retry_after_s() const;

 private:
  void worker_loop(size_t slot);
  void run(Job& job);
  size_t running_count() const;  // under mu_
  void finish(Job& job, JobOutcome::Status status, std::string error = "");
  void store_snapshot(const SessionState& s, std::span<const int32_t> tail);

  Engine& engine_;
  const text::Tokenizer& tokenizer_;
  Metrics& metrics_;
  SchedulerOptions options_;
  int64_t context_limit_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;  // [parallel] one per slot (null: idle)
  size_t reserved_ = 0;  // places held by requests whose bodies are still being read
  bool stopping_ = false;
  double average_job_s_ = 1.0;
  size_t cache_entries_ = 0;  // mirrors of the cache (worker-only) for gauges()
  uint64_t cache_bytes_ = 0;

  std::mutex cache_mu_;  // the slots share the prefix cache
  PrefixCache cache_;
  std::vector<std::thread> workers_;
};

}  // namespace dsv4::server
