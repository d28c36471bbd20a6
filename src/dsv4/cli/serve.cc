// dsv4 serve: loads the model, then serves the OpenAI-compatible API and the web chat page
// (src/dsv4/server/) until SIGINT or SIGTERM, which shut it down cleanly.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "dsv4/cli/common.h"
#include "dsv4/platform/platform.h"
#include "dsv4/server/http_server.h"
#include "dsv4/util/error.h"

namespace dsv4::cli {
namespace {

// While the model loads a signal exits at once; while serving, the first one starts a clean
// shutdown; during the shutdown a repeated SIGTERM is ignored (tools like timeout(1) deliver it
// twice, to the process and to its group) and a second Ctrl-C exits at once. The signals arrive
// on platform::SignalThread's own thread, which may stop the server with ordinary code.
class SignalWatcher {
 public:
  SignalWatcher() : thread_([this](bool interrupt) { on_signal(interrupt); }) {}
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // From now on a signal runs `stop` (once).
  void serving(std::function<void()> stop) {
    std::lock_guard lock(mu_);
    stop_ = std::move(stop);
    phase_ = Phase::kServing;
  }
  // The server is going away: `stop` must not be called any more.
  void stopping() {
    std::lock_guard lock(mu_);
    stop_ = nullptr;
    phase_ = Phase::kStopping;
  }

 private:
  enum class Phase { kStarting, kServing, kStopping };

  void on_signal(bool interrupt) {
    std::function<void()> stop;
    {
      std::lock_guard lock(mu_);
      if (phase_ == Phase::kStarting) {
        std::fputs("dsv4 serve: interrupted\n", stderr);
        platform::exit_now(130);
      }
      if (phase_ == Phase::kStopping) {
        if (!interrupt) return;
        std::fputs("dsv4 serve: interrupted again: exiting now\n", stderr);
        platform::exit_now(130);
      }
      phase_ = Phase::kStopping;
      stop = std::move(stop_);
    }
    fmt::print(stderr, "dsv4 serve: shutting down\n");
    stop();
  }

  std::mutex mu_;
  Phase phase_ = Phase::kStarting;
  std::function<void()> stop_;
  platform::SignalThread thread_;  // last: destroyed (joined) first
};

std::string directory_name(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty() && !p.has_filename()) p = p.parent_path();
  std::string name = p.filename().string();
  return name.empty() || name == "." ? "dsv4" : name;
}

}  // namespace

int serve(const ServeOptions& o) {
  platform::ignore_broken_pipe();  // a client that hangs up must not kill the server
  SignalWatcher signals;
  // The prefix cache is part of the budget: its bound is planned inside --ram.
  WorkloadShape workload = interactive_workload(o.model);
  if (o.cache_entries > 0) workload.prefix_cache_bytes = static_cast<uint64_t>(o.cache_mb) << 20;
  workload.sessions = o.parallel;  // 0: the plan picks the slot count
  if (o.parallel != 1) {
    // Rows per pass: a prompt chunk beside every slot's row (and its drafts).
    const int64_t slots = o.parallel > 0 ? o.parallel : kAutoSessions;
    workload.chunk_tokens = (o.model.chunk > 0 ? o.model.chunk : kBatchedPromptChunk) + slots * (1 + o.sampling.draft_max);
    workload.auto_chunk = false;
  }
  LoadedModel lm = load_model(o.model, workload, mtp_load_for(o.sampling.spec));
  if (lm.demo)
    fmt::print(stderr, "dsv4 serve: no -m given: serving the built-in demo model in {} (a tiny DeepSeek V4 trained on the King James Bible)\n",
               lm.dir);

  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.api_key = o.api_key;
  so.model_name = o.model_name.empty() ? directory_name(lm.dir) : o.model_name;
  so.max_body_bytes = static_cast<size_t>(o.max_body_mb) << 20;
  so.log_requests = true;
  so.defaults.sampling = sampling_params(lm.dir, o.sampling);
  so.defaults.seed = o.sampling.seed;
  so.defaults.max_tokens = o.sampling.max_tokens;
  so.defaults.stop = o.sampling.stop;
  so.defaults.spec = parse_spec_mode(o.sampling.spec);
  so.defaults.draft_max = static_cast<int>(o.sampling.draft_max);
  so.defaults.mtp_loaded = lm.engine->has_mtp();
  so.defaults.vocab_size = static_cast<int32_t>(lm.engine->config().vocab_size);
  so.scheduler.max_queue = static_cast<size_t>(o.max_queue);
  so.scheduler.cache_entries = static_cast<size_t>(o.cache_entries);
  so.scheduler.cache_bytes = static_cast<uint64_t>(o.cache_mb) << 20;
  // A block boundary where every compressor's window is complete: a block snapshot then holds
  // no compressor remainder to speak of, and its entries are final.
  for (const LayerSpec& layer : lm.engine->config().layers)
    if (layer.compress_ratio > 0 && o.cache_block % layer.compress_ratio != 0)
      fail("--cache-block {} must be a multiple of the checkpoint's compression ratios (this layer's is {})",
           o.cache_block, layer.compress_ratio);
  so.scheduler.cache_block = o.cache_block;
  so.scheduler.cache_dir = o.cache_dir;
  so.scheduler.cache_dir_bytes = static_cast<uint64_t>(o.cache_dir_mb) << 20;
  so.model_aliases = o.model_aliases;
  so.strict_model = o.strict_model;
  so.scheduler.context_limit = o.model.ctx;
  so.scheduler.parallel = static_cast<int>(lm.plan.sessions);
  // Several slots: a prompt goes in bounded chunks, so the other slots' streams wait at most
  // a chunk's pass per token.
  so.scheduler.chunk = o.model.chunk > 0 || lm.plan.sessions == 1 ? o.model.chunk : kBatchedPromptChunk;

  so.scheduler.token_delay_ms = o.token_delay_ms;
  so.scheduler.steer_to_budget = !o.unsteered_constraints;

  if (const std::string w = server::exposure_warning(o.host, !o.api_key.empty()); !w.empty())
    fmt::print(stderr, "dsv4 serve: warning: {}\n", w);
  server::Server server(*lm.engine, lm.tokenizer, so);
  const int port = server.bind();
  const bool v6 = o.host.find(':') != std::string::npos && o.host.front() != '[';
  fmt::print("dsv4 serve: listening on http://{}:{}/ (model \"{}\", {} slot{}, queue {}, {})\n",
             v6 ? "[" + o.host + "]" : o.host, port, so.model_name, so.scheduler.parallel,
             so.scheduler.parallel == 1 ? "" : "s", o.max_queue, o.api_key.empty() ? "no API key" : "API key required");
  std::fflush(stdout);
  signals.serving([&server] { server.stop(); });
  server.run();
  signals.stopping();
  server.stop();
  return 0;
}

}  // namespace dsv4::cli
