// dsv4 bench -m DIR: end-to-end speed of one model under a RAM budget — load time, time to
// first token, prefill and decode speed, expert cache hit rate and bytes read per token —
// next to the SSD's own O_DIRECT bandwidth measured in the same run, so the decode time can
// be compared with its I/O lower bound.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/bench/bench.h"
#include "dsv4/bench/expert_trace.h"
#include "dsv4/bench/machine_limits.h"
#include "dsv4/bench/ssd_probe.h"
#include "dsv4/cli/common.h"
#include "dsv4/io/tensor_order.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/memory.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v);

// Speculative decoding beside plain decoding in the same run, from the same prefilled session:
// greedy, off and the mode alternated three times (medians), each generating the same tokens (the
// run fails if they differ). Oracle drafts are the plain run's tokens, so every draft is right:
// the machinery's ceiling.
nlohmann::ordered_json spec_report(const BenchModelOptions& o, Engine& engine, const std::vector<int32_t>& prompt,
                                   int64_t chunk) {
  SessionState start = engine.new_session();
  engine.forward(start, std::span<const int32_t>(prompt).first(prompt.size() - 1), nullptr, LogitRows::kLast, chunk);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = o.gen_tokens + 1;  // the first comes from the prompt's last row
  req.sampling.temperature = 0;
  req.chunk = chunk;
  req.draft_max = static_cast<int>(o.draft_max);
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t) { return std::string(); };
  auto run = [&](SpecMode mode, const std::vector<int32_t>& oracle) {
    SessionState s = start;
    GenerationRequest r = req;
    r.spec = mode;
    r.oracle = oracle;
    return generate(engine, s, r, cb);
  };
  const SpecMode mode = parse_spec_mode(o.spec);
  const std::vector<int32_t> plain = run(SpecMode::kOff, {}).tokens;  // also warms the caches
  std::vector<double> off_rate, spec_rate, off_bytes, spec_bytes;
  GenerationStats last;
  for (int rep = 0; rep < 3; ++rep) {
    const GenerationResult off = run(SpecMode::kOff, {});
    const GenerationResult sp = run(mode, plain);
    if (sp.tokens != off.tokens || off.tokens != plain)
      fail("bench --spec {}: the speculative run generated other tokens than plain decoding", o.spec);
    off_rate.push_back(off.stats.decode_tok_s());
    spec_rate.push_back(sp.stats.decode_tok_s());
    off_bytes.push_back(double(off.stats.bytes_read) / double(off.stats.generated_tokens));
    spec_bytes.push_back(double(sp.stats.bytes_read) / double(sp.stats.generated_tokens));
    last = sp.stats;
  }
  std::vector<double> by_position;
  for (size_t i = 0; i < last.drafted_at.size(); ++i)
    by_position.push_back(last.drafted_at[i] ? double(last.accepted_at[i]) / double(last.drafted_at[i]) : 0.0);
  nlohmann::ordered_json j;
  j["mode"] = o.spec;
  j["draft_max"] = o.draft_max;
  j["decode_tok_s"] = median(spec_rate);
  j["off_decode_tok_s"] = median(off_rate);
  j["speedup"] = median(off_rate) > 0 ? median(spec_rate) / median(off_rate) : 0.0;
  j["decode_tok_s_runs"] = spec_rate;
  j["off_decode_tok_s_runs"] = off_rate;
  j["acceptance"] = last.acceptance();
  j["acceptance_by_position"] = by_position;
  j["tokens_per_pass"] = last.tokens_per_pass();
  j["bytes_read_per_token"] = median(spec_bytes);
  j["off_bytes_read_per_token"] = median(off_bytes);
  return j;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::ordered_json stats_json(const ExpertStats& s) {
  return {{"requests", s.requests},         {"hits", s.hits},
          {"misses", s.misses},             {"reads", s.reads},
          {"bytes_read", s.bytes_read},     {"demand_reads", s.demand_reads},
          {"predicted_reads", s.predicted_reads}, {"predicted_unused", s.predicted_unused},
          {"expected_reads", s.expected_reads}, {"read_requests", s.read_requests},
          {"read_windows", s.read_windows}, {"read_pieces", s.read_pieces},
          {"merged_windows", s.merged_windows},
          {"read_retries", s.read_retries},
          {"read_failures", s.read_failures},
          {"stalls", s.stalls},             {"read_seconds", s.read_seconds},
          {"blocked_seconds", s.blocked_seconds}, {"read_gbps", s.read_gbps()}};
}

struct ReplayReport {
  nlohmann::ordered_json policies, replays, variants;
};

// Hit rates of cache policies on the trace's decode tokens (token 0 is the prefill).
nlohmann::ordered_json policy_report(const Checkpoint& ck, const MemoryPlan& plan,
                                     const std::vector<ExpertEvent>& trace) {
  nlohmann::ordered_json policies = nlohmann::ordered_json::object();
  if (plan.all_resident) return policies;
  const ModelConfig& c = ck.config();
  for (const char* p : {"freq", "lru", "lfu", "opt"})
    policies[p] = simulate_hit_rate(trace, c.n_routed_experts, plan.slots, p, 1, c.num_hash_layers, c.n_experts_per_token);
  return policies;
}

// The recorded requests replayed against fresh stores with a synthetic compute model: at
// several compute speeds, and at the nominal speed with each read queue and lookahead policy.
ReplayReport replay_report(const BenchModelOptions& o, const Checkpoint& ck, const MemoryPlan& plan,
                           const std::vector<ExpertEvent>& trace, double ssd_gbps, ExpertStoreOptions so) {
  ReplayReport rep;
  rep.policies = policy_report(ck, plan, trace);
  rep.replays = nlohmann::ordered_json::array();
  rep.variants = nlohmann::ordered_json::array();
  std::vector<std::string> shard_paths;
  for (const auto& s : ck.shards()) shard_paths.push_back(s->path());
  so.slots = plan.slots;
  const int L = ck.config().num_layers, K = ck.config().n_experts_per_token;
  auto run = [&](const std::vector<ExpertEvent>& events, const ExpertStoreOptions& opts, const ComputeModel& cm) {
    drop_page_cache(shard_paths);
    const ReplayResult r = replay_trace(ck, events, opts, cm, 1);
    const double per_token = r.seconds / r.tokens;
    const double io = double(r.stats.bytes_read) / r.tokens / (ssd_gbps * 1e9);
    const double comp = cm.per_token(L, K);
    return nlohmann::ordered_json{{"compute_s_per_token", comp},
                                  {"io_bound_s_per_token", io},
                                  {"s_per_token", per_token},
                                  {"blocked_s_per_token", r.stats.blocked_seconds / r.tokens},
                                  {"hit_rate", r.stats.hit_rate()},
                                  {"bytes_read_per_token", double(r.stats.bytes_read) / r.tokens},
                                  {"predicted_reads", r.stats.predicted_reads},
                                  {"predicted_unused", r.stats.predicted_unused},
                                  {"read_gbps", r.stats.read_gbps()},
                                  {"ratio_to_max", per_token / std::max(io, comp)}};
  };
  for (double scale : o.replay_scales) {
    const ComputeModel cm{o.replay_compute.layer_dense_s * scale, o.replay_compute.expert_s * scale,
                          o.replay_compute.head_s * scale};
    nlohmann::ordered_json r = run(trace, so, cm);
    r["compute_scale"] = scale;
    rep.replays.push_back(r);
  }
  // The same trace with fewer guesses: none, or only the exact ones (hash-routed layers).
  std::vector<ExpertEvent> no_guess, exact_guess;
  for (const ExpertEvent& e : trace) {
    if (e.kind != ExpertEvent::Kind::kPredict) no_guess.push_back(e);
    if (e.kind != ExpertEvent::Kind::kPredict || ck.config().layer(e.layer).hash_routed) exact_guess.push_back(e);
  }
  struct Variant {
    const char* name;
    IoBackend io;
    int guesses;  // -1 eager, 0 none, n idle-only with n in flight
    bool exact_only = false;
  };
  for (double scale : {1.0, 2.0}) {
    for (const Variant& v : {Variant{"io_uring, no lookahead", IoBackend::kNative, 0},
                             Variant{"io_uring, exact lookahead (hash)", IoBackend::kNative, 1, true},
                             Variant{"io_uring, lookahead idle-only x1", IoBackend::kNative, 1},
                             Variant{"io_uring, lookahead idle-only x2", IoBackend::kNative, 2},
                             Variant{"io_uring, lookahead eager", IoBackend::kNative, -1},
                             Variant{"threads, no lookahead", IoBackend::kThreads, 0},
                             Variant{"threads, lookahead idle-only x1", IoBackend::kThreads, 1}}) {
      ExpertStoreOptions vo = so;
      vo.backend = v.io;
      vo.max_predicted_in_flight = v.guesses;
      const ComputeModel cm{o.replay_compute.layer_dense_s * scale, o.replay_compute.expert_s * scale,
                            o.replay_compute.head_s * scale};
      nlohmann::ordered_json r = run(v.guesses == 0 ? no_guess : v.exact_only ? exact_guess : trace, vo, cm);
      r["variant"] = v.name;
      r["compute_scale"] = scale;
      rep.variants.push_back(r);
    }
  }
  return rep;
}

void print_replay(const MemoryPlan& plan, const ReplayReport& rr) {
  const auto& policies = rr.policies;
  if (!policies.empty())
    fmt::print("policies     decode hit rate with {} slots: frequency {:.3f}, LRU {:.3f}, LFU {:.3f}, optimal (Belady) {:.3f}\n",
               plan.slots, policies["freq"].get<double>(), policies["lru"].get<double>(), policies["lfu"].get<double>(),
               policies["opt"].get<double>());
  for (const auto& r : rr.replays)
    fmt::print("replay       compute x{:<4} {:.3f} s/token compute, {:.3f} s/token i/o bound -> {:.3f} s/token "
               "({:.2f} x max), {:.3f} s/token blocked\n",
               r["compute_scale"].get<double>(), r["compute_s_per_token"].get<double>(),
               r["io_bound_s_per_token"].get<double>(), r["s_per_token"].get<double>(),
               r["ratio_to_max"].get<double>(), r["blocked_s_per_token"].get<double>());
  for (const auto& r : rr.variants)
    fmt::print("variant x{:<3} {:<34} {:.3f} s/token ({:.2f} x max), {:.3f} blocked, {:.0f} MB/token, hit {:.3f}, "
               "{:.2f} GB/s\n",
               r["compute_scale"].get<double>(), r["variant"].get<std::string>(), r["s_per_token"].get<double>(),
               r["ratio_to_max"].get<double>(), r["blocked_s_per_token"].get<double>(),
               r["bytes_read_per_token"].get<double>() / 1e6, r["hit_rate"].get<double>(), r["read_gbps"].get<double>());
}

// Multiply-adds per prompt token of a prefill (2 FLOP each): every matrix of the main layers
// once per token (routed experts: K of E per layer), and the head once per logit row. 1-D
// tensors (norms, biases) and the embedding lookup are not products; the MTP layer does not
// run. This is the "2 x active parameters" of the issue, counted from the checkpoint itself.
struct PrefillWork {
  double per_token = 0;  // parameters multiplied per token (main layers)
  double head = 0;       // head parameters, multiplied once per logit row
  double flops(int64_t tokens, int64_t logit_rows) const { return 2.0 * (per_token * tokens + head * logit_rows); }
};

PrefillWork prefill_work(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  PrefillWork w;
  for (const auto& [name, ref] : ck.tensors()) {
    const auto& shape = ref.info->shape;
    if (shape.size() != 2 || name == "embed.weight" || name.rfind("mtp.", 0) == 0) continue;
    // Weights only: not the E8M0 block scales, not the hash routing table (integers); packed
    // FP4 experts (I8) hold two values per byte.
    const DType t = ref.info->dtype;
    if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16 && t != DType::kF8_E4M3 && t != DType::kI8) continue;
    const double numel = double(shape[0]) * double(shape[1]) * (t == DType::kI8 ? 2.0 : 1.0);
    if (name.rfind("layers.", 0) != 0) {
      if (name == "head.weight") w.head += numel;
      continue;
    }
    const bool routed = name.find(".ffn.experts.") != std::string::npos;
    w.per_token += routed ? numel * c.n_experts_per_token / c.n_routed_experts : numel;
  }
  return w;
}

// A pseudo-random prompt of n tokens (fixed by the seed, so runs are comparable).
std::vector<int32_t> random_prompt(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  uint64_t x = 0x243F6A8885A308D3ull ^ seed;
  for (int32_t& t : prompt) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return prompt;
}

// --soak MINUTES: generate for that long in cycles (a fresh session with a new prompt of
// --prompt-tokens, then --gen-tokens decoded) and report every cycle's decode speed, the
// store's read rate, hit rate, time blocked and RSS. Slow drift (fragmentation, leaks,
// throttling) shows as the last quarter of the cycles against the first.
nlohmann::ordered_json soak(Engine& engine, const BenchModelOptions& o, bool print) {
  const int64_t V = engine.config().vocab_size;
  ExpertProvider& experts = engine.experts();
  std::vector<float> logits(static_cast<size_t>(V));
  nlohmann::ordered_json cycles = nlohmann::ordered_json::array();
  std::vector<double> tok_s, read_gbps;
  std::vector<uint64_t> rss;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t cycle = 0; seconds_since(start) < o.soak_minutes * 60; ++cycle) {
    SessionState session = engine.new_session();
    engine.forward(session, random_prompt(o.prompt_tokens, o.seed + 1 + cycle, V), logits.data(), LogitRows::kLast,
                   o.model.chunk);
    int32_t next = argmax(logits);
    const ExpertStats before = experts.stats();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.gen_tokens; ++i) {
      engine.anticipate(std::span<const int32_t>(&next, 1));
      engine.forward(session, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
      next = argmax(logits);
    }
    const double seconds = seconds_since(t0);
    const ExpertStats d = experts.stats() - before;
    tok_s.push_back(double(o.gen_tokens) / seconds);
    read_gbps.push_back(seconds > 0 ? double(d.bytes_read) / seconds / 1e9 : 0.0);
    rss.push_back(current_rss_bytes());
    const double at = seconds_since(start);
    cycles.push_back({{"cycle", cycle},
                      {"t_s", at},
                      {"decode_tok_s", tok_s.back()},
                      {"read_gbps", read_gbps.back()},
                      {"store_read_gbps", d.read_gbps()},
                      {"hit_rate", d.hit_rate()},
                      {"blocked_s_per_token", d.blocked_seconds / double(o.gen_tokens)},
                      {"rss_bytes", rss.back()}});
    if (print)
      fmt::print("soak         cycle {:<4} t {:7.1f} s  decode {:6.2f} tok/s  read {:5.2f} GB/s  hit {:5.1f}%  "
                 "blocked {:.3f} s/token  RSS {}\n",
                 cycle, at, tok_s.back(), read_gbps.back(), 100 * d.hit_rate(),
                 d.blocked_seconds / double(o.gen_tokens), format_bytes(rss.back()));
  }
  // First and last quarter (at least one cycle each).
  const size_t n = tok_s.size(), q = std::max<size_t>(1, n / 4);
  auto part = [&](const std::vector<double>& v, bool last) {
    return median(std::vector<double>(last ? v.end() - q : v.begin(), last ? v.end() : v.begin() + q));
  };
  nlohmann::ordered_json r;
  r["minutes"] = o.soak_minutes;
  r["cycles"] = cycles;
  r["decode_tok_s_first_quarter"] = part(tok_s, false);
  r["decode_tok_s_last_quarter"] = part(tok_s, true);
  r["read_gbps_first_quarter"] = part(read_gbps, false);
  r["read_gbps_last_quarter"] = part(read_gbps, true);
  r["rss_bytes_first"] = rss.front();
  r["rss_bytes_last"] = rss.back();
  if (print)
    fmt::print("soak         {} cycles in {:.1f} min: decode {:.2f} -> {:.2f} tok/s ({:+.1f}%), read {:.2f} -> {:.2f} "
               "GB/s (medians of the first and last quarter), RSS {} -> {}\n",
               n, seconds_since(start) / 60, part(tok_s, false), part(tok_s, true),
               100 * (part(tok_s, true) / part(tok_s, false) - 1), part(read_gbps, false), part(read_gbps, true),
               format_bytes(rss.front()), format_bytes(rss.back()));
  return r;
}

}  // namespace

int bench_model(const BenchModelOptions& o) {
  if (!o.sessions.empty()) return bench_sessions(o);
  if (o.prompt_tokens < 1) fail("--prompt-tokens must be at least 1");
  if (o.gen_tokens < 1) fail("--gen-tokens must be at least 1");
  auto checkpoint = std::make_unique<const Checkpoint>(Checkpoint::open(o.model.dir, o.model.mirrors));
  const Checkpoint& probe_ck = *checkpoint;  // the engine takes it over, it stays where it is
  std::vector<int32_t> prompt_ids;
  if (!o.prompt_file.empty()) {
    prompt_ids = parse_token_ids(read_small_file(o.prompt_file, 256 << 20), o.prompt_file);
    if (prompt_ids.empty()) fail("{}: no token ids (--prompt-file)", o.prompt_file);
    for (int32_t t : prompt_ids)
      if (t >= probe_ck.config().vocab_size) fail("{}: token id {} is outside the vocabulary (--prompt-file)", o.prompt_file, t);
  }
  const int64_t prompt_len = prompt_ids.empty() ? o.prompt_tokens : static_cast<int64_t>(prompt_ids.size());
  std::vector<std::string> shard_paths;
  for (const auto& s : probe_ck.shards()) shard_paths.push_back(s->path());
  const int64_t V = probe_ck.config().vocab_size;
  const std::string tensor_order = checkpoint_tensor_order(probe_ck);  // official | contiguous | other | mixed
  const IoBackend backend = parse_io_backend(o.model.io);
  WorkloadShape workload;
  workload.context_tokens = prompt_len + o.gen_tokens;
  choose_chunk(workload, o.model.chunk, prompt_len);
  LoadOptions load = load_options(o.model, workload);
  load.print_plan = !o.json;
  load.mtp = o.spec == "mtp" ? MtpLoad::kYes : MtpLoad::kNo;
  load.engine.lookahead = o.lookahead == "off"   ? ExpertLookahead::kOff
                          : o.lookahead == "all" ? ExpertLookahead::kAll
                                                 : ExpertLookahead::kExact;
  load.engine.early_hash_reads = o.early_hash_reads;
  // The bench wraps the planned provider so it can record the expert requests.
  TracingProvider* tracing = nullptr;
  load.wrap_provider = [&tracing](std::unique_ptr<ExpertProvider> planned) {
    auto t = std::make_unique<TracingProvider>(std::move(planned));
    tracing = t.get();
    return std::unique_ptr<ExpertProvider>(std::move(t));
  };
  const MemoryPlan plan = plan_for(probe_ck, load);
  const ExpertStoreOptions& store = load.store;

  // The device, cold: drop the shards from the page cache and read a large span, in 4 MiB
  // reads and in expert-sized (16 MiB) reads, 4 in flight as the store reads; the better of
  // the two is the device's bandwidth.
  auto probe = [&](double where) {
    const SsdProbeResult a = probe_direct_read(shard_paths, o.probe_bytes / 2, 4, backend, where, 4ull << 20);
    const SsdProbeResult b = probe_direct_read(shard_paths, o.probe_bytes / 2, 4, backend, where + 0.1, 16ull << 20);
    return a.gbps() >= b.gbps() ? a : b;
  };

  if (!o.trace_in.empty()) {
    // Replay only: no forward pass; the requests come from an earlier run's --trace-out.
    const double gbps = probe(0.2).gbps();
    const ReplayReport rr = replay_report(o, probe_ck, plan, load_trace(o.trace_in), gbps, store);
    if (o.json) {
      nlohmann::ordered_json j{{"ssd_gbps_measured", gbps}, {"plan", plan.summary()}, {"policy_hit_rates", rr.policies},
                               {"replay", rr.replays}, {"replay_variants", rr.variants}};
      std::puts(j.dump(2).c_str());
    } else {
      fmt::print("{}\nssd          {:.2f} GB/s O_DIRECT\n", plan.summary(), gbps);
      print_replay(plan, rr);
    }
    return 0;
  }

  const SsdProbeResult ssd_before = probe(0.2);
  drop_page_cache(shard_paths);
  auto t0 = std::chrono::steady_clock::now();
  auto engine = load_engine(std::move(checkpoint), load).engine;
  const double load_s = seconds_since(t0);
  ExpertProvider& experts = engine->experts();

  // A fixed pseudo-random prompt (the same for every budget, so runs are comparable), or
  // real text's ids from --prompt-file (a trained model's routing on text it can read).
  const std::vector<int32_t> prompt = prompt_ids.empty() ? random_prompt(o.prompt_tokens, o.seed, V) : prompt_ids;
  // The FP32 FMA peak of this path at the engine's thread count, in the same run (before the
  // prefill and after the decode: the machine's limits move from minute to minute).
  const PrefillWork work = prefill_work(probe_ck);
  double fma_before = 0;
  {
    ThreadPool probe_pool(engine->threads());
    fma_before = kernels::measure_fma_gflops(&probe_pool, 3);
  }
  SessionState session = engine->new_session();
  const uint64_t session_fresh = session.used_bytes();
  std::vector<float> logits(static_cast<size_t>(V));
  const ExpertStats s0 = experts.stats();
  t0 = std::chrono::steady_clock::now();
  engine->forward(session, prompt, logits.data(), LogitRows::kLast, engine->max_rows());
  int32_t next = argmax(logits);
  const double ttft_s = seconds_since(t0);
  engine->anticipate(std::span<const int32_t>(&next, 1));  // as the generator does once it has a token
  const ExpertStats s1 = experts.stats();
  tracing->mark_token_end();
  // The session state the prompt filled, per token of context, against the plan's figure.
  const uint64_t session_used = session.used_bytes();
  const double session_token_bytes = double(session_used - session_fresh) / double(prompt_len);

  std::vector<double> step_s;
  std::vector<int32_t> generated{next};
  for (int64_t i = 0; i < o.gen_tokens; ++i) {
    t0 = std::chrono::steady_clock::now();
    engine->forward(session, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
    next = argmax(logits);
    if (i + 1 < o.gen_tokens) engine->anticipate(std::span<const int32_t>(&next, 1));
    step_s.push_back(seconds_since(t0));
    generated.push_back(next);
    tracing->mark_token_end();
  }
  const ExpertStats s2 = experts.stats();
  const uint64_t peak_rss = peak_rss_bytes();
  const SsdProbeResult ssd_after = probe(0.6);
  double fma_after = 0;
  {
    ThreadPool probe_pool(engine->threads());
    fma_after = kernels::measure_fma_gflops(&probe_pool, 3);
  }
  const double fma_gflops = 0.5 * (fma_before + fma_after);
  const double prefill_gflops = work.flops(prompt_len, 1) / ttft_s / 1e9;

  const ExpertStats prefill = s1 - s0, decode = s2 - s1;
  double decode_total = 0;
  for (double s : step_s) decode_total += s;
  const double G = static_cast<double>(o.gen_tokens);
  const double decode_s_per_token = decode_total / G;
  const double ssd_gbps = 0.5 * (ssd_before.gbps() + ssd_after.gbps());
  const double bytes_per_token = double(decode.bytes_read) / G;
  const double io_bound_s = ssd_gbps > 0 ? bytes_per_token / (ssd_gbps * 1e9) : 0.0;
  const bool all_resident = plan.all_resident;
  const double blocked_per_token = decode.blocked_seconds / G;
  const double compute_per_token = decode_s_per_token - blocked_per_token;
  const double floor_s = std::max(io_bound_s, all_resident ? decode_s_per_token : compute_per_token);

  if (!o.trace_out.empty()) save_trace(o.trace_out, tracing->events());
  ReplayReport rr;
  if (o.replay && !all_resident) {
    rr = replay_report(o, probe_ck, plan, tracing->events(), ssd_gbps, store);
  } else {
    rr.policies = policy_report(probe_ck, plan, tracing->events());
  }

  tracing->set_recording(false);  // the trace is used; the spec and soak runs need none
  const nlohmann::ordered_json spec = o.spec == "off" ? nlohmann::ordered_json() : spec_report(o, *engine, prompt, engine->max_rows());

  if (o.json) {
    nlohmann::ordered_json j;
    j["load_s"] = load_s;
    j["ttft_s"] = ttft_s;
    j["prefill_tok_s"] = double(prompt_len) / ttft_s;
    j["prefill_gflops"] = prefill_gflops;
    j["fma_gflops"] = fma_gflops;
    j["prefill_vs_fma"] = fma_gflops > 0 ? prefill_gflops / fma_gflops : 0.0;
    j["decode_tok_s"] = G / decode_total;
    j["hit_rate"] = decode.hit_rate();
    j["bytes_read_per_token"] = bytes_per_token;
    j["ssd_gbps_measured"] = ssd_gbps;
    j["io_bound_s_per_token"] = io_bound_s;
    j["resident_s_per_token"] = all_resident ? nlohmann::ordered_json(decode_s_per_token) : nlohmann::ordered_json();
    j["decode_s_per_token"] = decode_s_per_token;
    j["peak_rss_bytes"] = peak_rss;
    j["session_bytes_per_token"] = session_token_bytes;
    nlohmann::ordered_json d;
    d["model"] = o.model.dir;
    d["prompt_tokens"] = prompt_len;
    d["gen_tokens"] = o.gen_tokens;
    d["threads"] = engine->threads();
    d["kernels"] = kernels::active_path();
    d["kernel_tuning"] = kernels::active_tuning();
    d["chunk"] = engine->max_rows();
    d["chunk_auto"] = o.model.chunk <= 0;
    d["fma_gflops_before_after"] = {fma_before, fma_after};
    d["prefill_params_per_token"] = work.per_token;
    d["head_params"] = work.head;
    d["plan"] = plan.summary();
    d["session_bytes_after_prompt"] = session_used;
    d["planned_session_bytes_per_token"] = plan.session_token_bytes;
    d["planned_session_bytes"] = plan.session_bytes;
    d["workspace_bytes"] = plan.workspace_bytes;
    d["workspace_row_bytes"] = plan.workspace_row_bytes;
    d["budget_bytes"] = plan.budget;
    d["expert_slots"] = plan.slots;
    d["total_experts"] = plan.total_experts;
    d["lookahead"] = o.lookahead;
    d["early_hash_reads"] = o.early_hash_reads;
    d["tensor_order"] = tensor_order;
    d["ranges_per_expert"] = decode.ranges_per_read();
    d["prefill_ranges_per_expert"] = prefill.ranges_per_read();
    d["prefill_requests_per_expert"] = prefill.requests_per_read();
    d["read_requests_per_expert"] = decode.requests_per_read();
    d["layout_requests_per_expert"] = decode.ranges_per_read();
    d["pieces_per_expert"] = decode.reads ? double(decode.read_pieces) / double(decode.reads) : 0.0;
    d["merged_windows_per_expert"] = decode.reads ? double(decode.merged_windows) / double(decode.reads) : 0.0;
    d["prefill_merged_windows_per_expert"] =
        prefill.reads ? double(prefill.merged_windows) / double(prefill.reads) : 0.0;
    d["decode_s_per_token_median"] = median(step_s);
    d["decode_step_s"] = step_s;
    d["decode_blocked_s_per_token"] = blocked_per_token;
    d["decode_compute_s_per_token"] = compute_per_token;
    d["decode_vs_floor"] = floor_s > 0 ? decode_s_per_token / floor_s : 0.0;
    d["decode_vs_io_bound"] = io_bound_s > 0 ? decode_s_per_token / io_bound_s : 0.0;
    d["achieved_read_gbps"] = decode.read_gbps();
    d["decode_read_seconds_per_token"] = decode.read_seconds / G;
    d["folder_bytes_per_token"] = nlohmann::ordered_json::array();
    d["folder_busy_s_per_token"] = nlohmann::ordered_json::array();
    for (size_t f = 0; f < decode.folder_bytes.size(); ++f) {
      d["folder_bytes_per_token"].push_back(double(decode.folder_bytes[f]) / G);
      d["folder_busy_s_per_token"].push_back(decode.folder_busy_seconds[f] / G);
    }
    d["ssd_probe_gbps"] = {ssd_before.gbps(), ssd_after.gbps()};
    d["ssd_probe_direct"] = ssd_before.direct && ssd_after.direct;
    d["prefill_stats"] = stats_json(prefill);
    d["decode_stats"] = stats_json(decode);
    d["policy_hit_rates"] = rr.policies;
    d["replay"] = rr.replays;
    d["replay_variants"] = rr.variants;
    d["generated"] = generated;
    j["details"] = d;
    if (!spec.is_null()) j["spec"] = spec;
    if (o.soak_minutes > 0) j["soak"] = soak(*engine, o, false);
    std::puts(j.dump(2).c_str());
    return 0;
  }
  fmt::print("model        {} ({} threads, kernels {})\n", o.model.dir, engine->threads(), kernels::active_path());
  fmt::print("ssd          {:.2f} GB/s O_DIRECT ({:.2f} before, {:.2f} after{})\n", ssd_gbps, ssd_before.gbps(),
             ssd_after.gbps(), ssd_before.direct ? "" : "; buffered: O_DIRECT refused");
  fmt::print("load         {:.2f} s\n", load_s);
  fmt::print("prefill      {} tokens, TTFT {:.2f} s, {:.2f} tok/s, {:.1f}% hits, {:.2f} GB read\n", prompt_len,
             ttft_s, double(prompt_len) / ttft_s, 100 * prefill.hit_rate(), prefill.bytes_read / 1e9);
  fmt::print("prefill work {:.1f} GFLOP/s effective (2 x {:.2f} G parameters per token + head) = {:.0f}% of the FP32 FMA "
             "peak {:.0f} GFLOP/s ({} width, {} threads, same run: {:.0f} before, {:.0f} after)\n",
             prefill_gflops, work.per_token / 1e9, 100 * prefill_gflops / fma_gflops, fma_gflops, kernels::active_path(),
             engine->threads(), fma_before, fma_after);
  fmt::print("chunk        {} rows ({}), workspace {} ({}/row)\n", engine->max_rows(),
             o.model.chunk > 0 ? "--chunk" : "automatic: the largest the budget allows", format_bytes(plan.workspace_bytes),
             format_bytes(plan.workspace_row_bytes));
  fmt::print("session      {} after the prompt: {:.0f} B per token of context (planned {:.0f} B/token, {} at {} tokens)\n",
             format_bytes(session_used), session_token_bytes, plan.session_token_bytes, format_bytes(plan.session_bytes),
             plan.context_tokens);
  fmt::print("decode       {} tokens, {:.3f} s/token (median {:.3f}), {:.2f} tok/s\n", o.gen_tokens,
             decode_s_per_token, median(step_s), G / decode_total);
  fmt::print("experts      {:.1f}% hits, {:.1f} MB read/token at {:.3f} GB/s achieved, {:.3f} s/token blocked on I/O, "
             "{} predicted reads ({} unused), {} read on demand\n",
             100 * decode.hit_rate(), bytes_per_token / 1e6, decode.read_gbps(), blocked_per_token,
             decode.predicted_reads, decode.predicted_unused, decode.demand_reads);
  if (decode.folder_bytes.size() > 1) {
    // How evenly the folders share the reads: each one's bytes and busy time per token, against
    // the store's time with any read in flight.
    std::string line = fmt::format("folders      store busy {:.3f} s/token;", decode.read_seconds / G);
    for (size_t f = 0; f < decode.folder_bytes.size(); ++f) {
      const double busy = decode.folder_busy_seconds[f];
      line += fmt::format(" {}: {:.1f} MB/token, busy {:.3f} s/token ({:.2f} GB/s while busy)", f,
                          double(decode.folder_bytes[f]) / G / 1e6, busy / G,
                          busy > 0 ? double(decode.folder_bytes[f]) / busy / 1e9 : 0.0);
    }
    fmt::print("{}\n", line);
  }
  fmt::print("reads        {:.2f} read requests per expert (prefill {:.2f}); the {} layout reads an expert in {:.2f} "
             "ranges (prefill {:.2f}; {:.2f} pieces over {} folder{}; {:.0f}% of experts (prefill {:.0f}%) had their "
             "scales read with a neighbour's), {} retried, {} failed\n",
             decode.requests_per_read(), prefill.requests_per_read(), tensor_order, decode.ranges_per_read(),
             prefill.ranges_per_read(), decode.reads ? double(decode.read_pieces) / double(decode.reads) : 0.0,
             std::max<size_t>(1, decode.folder_bytes.size()), decode.folder_bytes.size() > 1 ? "s" : "",
             decode.reads ? 100.0 * double(decode.merged_windows) / double(decode.reads) : 0.0,
             prefill.reads ? 100.0 * double(prefill.merged_windows) / double(prefill.reads) : 0.0,
             decode.read_retries, decode.read_failures);
  fmt::print("i/o bound    {:.3f} s/token (bytes read / SSD bandwidth); decode / i/o bound = {:.2f}\n", io_bound_s,
             io_bound_s > 0 ? decode_s_per_token / io_bound_s : 0.0);
  fmt::print("compute      {:.3f} s/token (decode minus time blocked on I/O){}\n", compute_per_token,
             all_resident ? "; every expert resident" : "");
  fmt::print("peak RSS     {}\n", format_bytes(peak_rss));
  if (!spec.is_null())
    fmt::print("spec         {} (draft max {}): decode {:.2f} tok/s against {:.2f} off = {:.2f}x; acceptance {:.0f}% "
               "(by position {}), {:.2f} tokens/pass; {:.1f} MB read/token against {:.1f} off\n",
               spec["mode"].get<std::string>(), o.draft_max, spec["decode_tok_s"].get<double>(),
               spec["off_decode_tok_s"].get<double>(), spec["speedup"].get<double>(),
               100 * spec["acceptance"].get<double>(), spec["acceptance_by_position"].dump(),
               spec["tokens_per_pass"].get<double>(), spec["bytes_read_per_token"].get<double>() / 1e6,
               spec["off_bytes_read_per_token"].get<double>() / 1e6);
  print_replay(plan, rr);
  if (o.soak_minutes > 0) soak(*engine, o, true);
  return 0;
}

}  // namespace dsv4::cli
