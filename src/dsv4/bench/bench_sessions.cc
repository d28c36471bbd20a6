// dsv4 bench -m DIR --sessions N[,N...]: N concurrent synthetic streams sharing passes over
// the weights (Engine::join_batch) against one stream in the same run. Each round runs every
// count in turn (interleaved, so the machine's drift hits them alike): the N prompts are
// prefilled concurrently (TTFT: from the round's start to a stream's first token), then all N
// decode --gen-tokens tokens together (aggregate and per-stream tok/s, inter-token latency
// p50/p99, expert bytes read per token). --admit-prompt P: during the decode, one more
// request's P-token prompt is admitted in chunks of --chunk rows, and the streams' inter-token
// latency while it is admitted is compared with the p50 outside it.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/bench/bench.h"
#include "dsv4/cli/common.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/util/error.h"
#include "dsv4/util/memory.h"

namespace dsv4::cli {
namespace {

using Clock = std::chrono::steady_clock;

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q * double(v.size() - 1);
  const size_t i = static_cast<size_t>(at);
  const double f = at - double(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

double median_of(const std::vector<double>& v) { return quantile(v, 0.5); }

std::vector<int32_t> prompt_of(int64_t n, uint64_t seed, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return p;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Round {
  double aggregate_tok_s = 0, stream_tok_s = 0, ttft_p50 = 0, ttft_max = 0, itl_p50 = 0, itl_p99 = 0;
  double bytes_per_token = 0, rows_per_pass = 0;
  uint64_t passes = 0, returns_missed = 0;  // passes, and those that started without a session of the previous one
  // --admit-prompt: the streams' inter-token latency while the prompt was admitted / outside.
  double admit_itl_p99 = 0, admit_itl_p50 = 0, outside_itl_p50 = 0, admit_s = 0;
  int64_t admit_intervals = 0;
};

Round run_round(Engine& e, int n, int64_t prompt_len, int64_t gen, int64_t chunk, uint64_t seed,
                int64_t admit_len, int64_t admit_chunk) {
  const int64_t V = e.config().vocab_size;
  std::vector<SessionState> sessions;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    sessions.push_back(e.new_session());
    prompts.push_back(prompt_of(prompt_len, seed + 1000 * static_cast<uint64_t>(i), V));
  }
  const bool admit = admit_len > 0;
  SessionState admitted = admit ? e.new_session() : SessionState{};
  const std::vector<int32_t> admit_prompt = admit ? prompt_of(admit_len, seed + 777, V) : std::vector<int32_t>{};

  std::vector<double> ttft(static_cast<size_t>(n));
  std::vector<std::vector<Clock::time_point>> stamps(static_cast<size_t>(n));
  std::atomic<int64_t> decoded{0};
  std::atomic<bool> admit_done{!admit};
  Clock::time_point admit_start{}, admit_end{};
  std::barrier prefilled(n + 1);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      Engine::BatchMember member = e.join_batch();
      std::vector<float> logits(static_cast<size_t>(V));
      SessionState& s = sessions[static_cast<size_t>(i)];
      e.forward(s, prompts[static_cast<size_t>(i)], logits.data(), LogitRows::kLast, chunk);
      ttft[static_cast<size_t>(i)] = secs(start, Clock::now());
      int32_t next = argmax(logits);
      member.leave();  // a stream waiting at the barrier must not hold the others' passes
      prefilled.arrive_and_wait();
      member = e.join_batch();
      auto& st = stamps[static_cast<size_t>(i)];
      st.push_back(Clock::now());
      // With an admission, decode on until it is done (its window needs streams around it).
      for (int64_t k = 0; k < gen || !admit_done.load(); ++k) {
        if (s.position + 1 >= e.context_limit()) break;
        e.forward(s, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
        next = argmax(logits);
        st.push_back(Clock::now());
        decoded.fetch_add(1);
      }
    });
  prefilled.arrive_and_wait();
  const ExpertStats before = e.experts().stats();
  const Engine::PassCounts counts_before = e.pass_counts();
  const Clock::time_point decode_start = Clock::now();
  std::thread admitter;
  if (admit)
    admitter = std::thread([&] {
      // A member from its first chunk on, not while it sleeps (the passes would wait for it).
      while (decoded.load() < std::max<int64_t>(8, int64_t(n) * gen / 8)) std::this_thread::sleep_for(std::chrono::microseconds(200));
      Engine::BatchMember member = e.join_batch();
      std::vector<float> logits(static_cast<size_t>(V));
      admit_start = Clock::now();
      e.forward(admitted, admit_prompt, logits.data(), LogitRows::kLast, admit_chunk);
      admit_end = Clock::now();
      admit_done.store(true);
    });
  for (std::thread& t : threads) t.join();
  if (admitter.joinable()) admitter.join();
  const Clock::time_point decode_end = Clock::now();
  const ExpertStats delta = e.experts().stats() - before;
  const Engine::PassCounts counts_after = e.pass_counts();

  Round r;
  std::vector<double> itl, in_window, outside, per_stream;
  int64_t tokens = 0;
  for (const auto& st : stamps) {
    tokens += static_cast<int64_t>(st.size()) - 1;
    if (st.size() > 1) per_stream.push_back(double(st.size() - 1) / secs(st.front(), st.back()));
    for (size_t k = 1; k < st.size(); ++k) {
      const double d = secs(st[k - 1], st[k]);
      itl.push_back(d);
      if (!admit) continue;
      // An interval that overlaps the admission was delayed by it (or could have been).
      (st[k] > admit_start && st[k - 1] < admit_end ? in_window : outside).push_back(d);
    }
  }
  r.aggregate_tok_s = double(tokens) / secs(decode_start, decode_end);
  r.stream_tok_s = median_of(per_stream);
  r.ttft_p50 = median_of(ttft);
  r.ttft_max = *std::max_element(ttft.begin(), ttft.end());
  r.itl_p50 = quantile(itl, 0.5);
  r.itl_p99 = quantile(itl, 0.99);
  r.bytes_per_token = tokens ? double(delta.bytes_read) / double(tokens) : 0;
  const uint64_t passes = counts_after.passes - counts_before.passes;
  r.rows_per_pass = passes ? double(counts_after.parts - counts_before.parts) / double(passes) : 0;
  r.passes = passes;
  r.returns_missed = counts_after.returns_missed - counts_before.returns_missed;
  if (admit) {
    r.admit_itl_p99 = quantile(in_window, 0.99);
    r.admit_itl_p50 = quantile(in_window, 0.5);
    r.outside_itl_p50 = quantile(outside, 0.5);
    r.admit_s = secs(admit_start, admit_end);
    r.admit_intervals = static_cast<int64_t>(in_window.size());
  }
  return r;
}

}  // namespace

int bench_sessions(const BenchModelOptions& o) {
  if (o.prompt_tokens < 1) fail("--prompt-tokens must be at least 1");
  if (o.gen_tokens < 2) fail("--gen-tokens must be at least 2 with --sessions");
  std::vector<int> counts;
  for (int64_t n : o.sessions) counts.push_back(static_cast<int>(n));
  for (int n : counts)
    if (n < 1 || n > 256) fail("--sessions: {} is not a session count in [1, 256]", n);
  if (std::find(counts.begin(), counts.end(), 1) == counts.end()) counts.insert(counts.begin(), 1);
  const int most = *std::max_element(counts.begin(), counts.end());
  const int64_t admit_chunk = o.model.chunk > 0 ? o.model.chunk : kBatchedPromptChunk;
  WorkloadShape workload;
  // The streams decode on while a prompt is admitted: room for a pass per admitted chunk.
  const int64_t admit_passes = o.admit_prompt > 0 ? (o.admit_prompt + admit_chunk - 1) / admit_chunk : 0;
  workload.context_tokens = std::max(o.prompt_tokens + o.gen_tokens + 4 * admit_passes + 64, o.admit_prompt + 8);
  workload.chunk_tokens = std::max<int64_t>(resolve_chunk(o.model.chunk, o.prompt_tokens), most + admit_chunk);
  workload.sessions = most + (o.admit_prompt > 0 ? 1 : 0);
  LoadOptions load = load_options(o.model, workload);
  load.print_plan = !o.json;
  LoadedEngine loaded = load_engine(o.model.dir, load);
  Engine& e = *loaded.engine;
  const int64_t chunk = resolve_chunk(o.model.chunk, o.prompt_tokens);

  std::map<int, std::vector<Round>> rounds;
  run_round(e, 1, std::min<int64_t>(o.prompt_tokens, 8), 2, chunk, o.seed + 99, 0, admit_chunk);  // warm-up
  for (int round = 0; round < o.rounds; ++round)
    for (int n : counts) {
      rounds[n].push_back(run_round(e, n, o.prompt_tokens, o.gen_tokens, chunk, o.seed + uint64_t(round), 0, admit_chunk));
      if (!o.json) {
        const Round& r = rounds[n].back();
        fmt::print("round {} {} sessions: {:.2f} tok/s aggregate, {:.2f} per stream, ITL p50 {:.3f} s p99 {:.3f} s, "
                   "{:.2f} rows/pass\n", round, n, r.aggregate_tok_s, r.stream_tok_s, r.itl_p50, r.itl_p99,
                   r.rows_per_pass);
        std::fflush(stdout);
      }
    }
  std::vector<Round> admitted;
  if (o.admit_prompt > 0)
    for (int round = 0; round < o.rounds; ++round) {
      admitted.push_back(run_round(e, most, o.prompt_tokens, o.gen_tokens, chunk, o.seed + 50 + uint64_t(round),
                                   o.admit_prompt, admit_chunk));
      if (!o.json)
        fmt::print("round {} {} sessions + a {}-token prompt in chunks of {}: ITL p99 {:.3f} s while admitted "
                   "({} intervals, {:.1f} s), p50 {:.3f} s outside\n", round, most, o.admit_prompt, admit_chunk,
                   admitted.back().admit_itl_p99, admitted.back().admit_intervals, admitted.back().admit_s,
                   admitted.back().outside_itl_p50);
    }

  auto med = [](const std::vector<Round>& v, double Round::*field) {
    std::vector<double> x;
    for (const Round& r : v) x.push_back(r.*field);
    return median_of(x);
  };
  auto sum = [](const std::vector<Round>& v, uint64_t Round::*field) {
    uint64_t total = 0;
    for (const Round& r : v) total += r.*field;
    return total;
  };
  const double one = med(rounds[1], &Round::aggregate_tok_s);
  nlohmann::ordered_json j;
  j["model"] = o.model.dir;
  j["threads"] = e.threads();
  j["kernels"] = kernels::active_path();
  j["plan"] = loaded.plan.summary();
  j["all_resident"] = loaded.plan.all_resident;
  j["expert_slots"] = loaded.plan.slots;
  j["total_experts"] = loaded.plan.total_experts;
  j["prompt_tokens"] = o.prompt_tokens;
  j["gen_tokens"] = o.gen_tokens;
  j["rounds"] = o.rounds;
  nlohmann::ordered_json by = nlohmann::ordered_json::array();
  for (int n : counts) {
    const auto& v = rounds[n];
    const double agg = med(v, &Round::aggregate_tok_s);
    std::vector<double> runs;
    for (const Round& r : v) runs.push_back(r.aggregate_tok_s);
    by.push_back({{"sessions", n},
                  {"aggregate_tok_s", agg},
                  {"vs_one_session", one > 0 ? agg / one : 0},
                  {"aggregate_tok_s_runs", runs},
                  {"stream_tok_s", med(v, &Round::stream_tok_s)},
                  {"ttft_s_p50", med(v, &Round::ttft_p50)},
                  {"ttft_s_max", med(v, &Round::ttft_max)},
                  {"itl_s_p50", med(v, &Round::itl_p50)},
                  {"itl_s_p99", med(v, &Round::itl_p99)},
                  {"bytes_read_per_token", med(v, &Round::bytes_per_token)},
                  {"sessions_per_pass", med(v, &Round::rows_per_pass)},
                  {"passes", sum(v, &Round::passes)},
                  {"passes_missing_a_returning_session", sum(v, &Round::returns_missed)}});
  }
  j["by_sessions"] = by;
  if (!admitted.empty()) {
    const double p99 = med(admitted, &Round::admit_itl_p99);
    const double p50_without = med(rounds[most], &Round::itl_p50);
    j["admission"] = {{"sessions", most},
                      {"prompt_tokens", o.admit_prompt},
                      {"chunk", admit_chunk},
                      {"itl_s_p99_while_admitted", p99},
                      {"itl_s_p50_while_admitted", med(admitted, &Round::admit_itl_p50)},
                      {"itl_s_p50_outside", med(admitted, &Round::outside_itl_p50)},
                      {"itl_s_p50_without", p50_without},
                      {"p99_admitted_vs_p50_without", p50_without > 0 ? p99 / p50_without : 0},
                      {"admit_s", med(admitted, &Round::admit_s)},
                      {"passes", sum(admitted, &Round::passes)},
                      {"passes_missing_a_returning_session", sum(admitted, &Round::returns_missed)}};
  }
  j["peak_rss_bytes"] = peak_rss_bytes();
  if (o.json) {
    std::puts(j.dump(2).c_str());
    return 0;
  }
  fmt::print("model        {} ({} threads, kernels {}), {}\n", o.model.dir, e.threads(), kernels::active_path(),
             loaded.plan.all_resident ? "every expert resident"
                                      : fmt::format("{} of {} experts cached", loaded.plan.slots, loaded.plan.total_experts));
  for (const auto& row : by)
    fmt::print("sessions {:>3}  {:.2f} tok/s aggregate = {:.2f}x one session; {:.2f} tok/s per stream; TTFT p50 {:.2f} s "
               "(max {:.2f}); ITL p50 {:.3f} s p99 {:.3f} s; {:.1f} MB read/token; {:.2f} sessions/pass (medians of {}); "
               "{} of {} passes missed a session of the previous pass\n",
               row["sessions"].get<int>(), row["aggregate_tok_s"].get<double>(), row["vs_one_session"].get<double>(),
               row["stream_tok_s"].get<double>(), row["ttft_s_p50"].get<double>(), row["ttft_s_max"].get<double>(),
               row["itl_s_p50"].get<double>(), row["itl_s_p99"].get<double>(),
               row["bytes_read_per_token"].get<double>() / 1e6, row["sessions_per_pass"].get<double>(), o.rounds,
               row["passes_missing_a_returning_session"].get<uint64_t>(), row["passes"].get<uint64_t>());
  if (j.contains("admission")) {
    const auto& a = j["admission"];
    fmt::print("admission    {} sessions + a {}-token prompt in chunks of {} ({:.1f} s): ITL p99 {:.3f} s while "
               "admitted = {:.2f}x the p50 without it ({:.3f} s); {} of {} passes missed a session of the previous pass\n",
               most, o.admit_prompt, admit_chunk, a["admit_s"].get<double>(), a["itl_s_p99_while_admitted"].get<double>(),
               a["p99_admitted_vs_p50_without"].get<double>(), a["itl_s_p50_without"].get<double>(),
               a["passes_missing_a_returning_session"].get<uint64_t>(), a["passes"].get<uint64_t>());
  }
  fmt::print("peak RSS     {}\n", format_bytes(peak_rss_bytes()));
  return 0;
}

}  // namespace dsv4::cli
