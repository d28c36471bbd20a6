#include "dsv4/cli/common.h"
#include "dsv4/platform/platform.h"

#include "dsv4/runtime/speculative.h"

#include <algorithm>
#include <filesystem>
#include <random>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "dsv4/gpu/backend.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/memory.h"

namespace dsv4::cli {

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    const char ch = text[i];
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      ++i;
      continue;
    }
    if (ch < '0' || ch > '9') fail("{}: expected token ids separated by commas or spaces, found '{}' at byte {}", what, ch, i);
    int64_t v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      v = v * 10 + (text[i] - '0');
      if (v > INT32_MAX) fail("{}: token id at byte {} is too large", what, i);
      ++i;
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

namespace {

bool has_config(const std::string& dir) { return path_exists(dir + "/config.json"); }

// The built-in demo model ships in the source tree as models/demo. Looked for next to the
// binary first (build/<type>/dsv4 → two levels up), so a moved or copied tree still finds
// its own model, then in the tree the binary was built from.
std::string find_demo_model(const std::string& override_dir) {
  if (!override_dir.empty()) {
    if (!has_config(override_dir)) fail("DSV4_DEMO_DIR={}: no config.json there", override_dir);
    return override_dir;
  }
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::canonical(platform::fs_path(platform::executable_path()), ec);
  std::vector<std::string> tried;
  if (!ec) {
    std::filesystem::path p = exe.parent_path();
    for (int up = 0; up < 4 && !p.empty(); ++up, p = p.parent_path()) {
      const std::string candidate = platform::utf8_path(p / "models" / "demo");
      if (has_config(candidate)) return candidate;
      tried.push_back(candidate);
      if (p == p.root_path()) break;
    }
  }
  const std::string built_from = DSV4_DEMO_MODEL_DIR;
  if (has_config(built_from)) return built_from;
  if (std::find(tried.begin(), tried.end(), built_from) == tried.end()) tried.push_back(built_from);
  std::string list;
  for (const std::string& t : tried) list += (list.empty() ? "" : ", ") + t;
  fail("no -m given and the built-in demo model is missing (looked for config.json in {}); pass -m DIR", list);
}

}  // namespace

std::string resolve_model_dir(const ModelOptions& m) {
  if (!m.dir.empty()) {
    if (is_directory(m.dir)) return m.dir;
    if (path_exists(m.dir)) fail("{}: is a file, not a checkpoint directory (-m takes the directory)", m.dir);
    fail("{}: no such checkpoint directory (-m)", m.dir);
  }
  return find_demo_model(m.demo_dir);
}

LoadOptions load_options(const ModelOptions& m, const WorkloadShape& workload) {
  LoadOptions o;
  o.ram = m.ram;
  o.workload = workload;
  o.engine.numerics = m.numerics == "reference" ? kernels::Numerics::kReference : kernels::Numerics::kFast;
  o.engine.threads = m.threads;
  o.engine.batch_prompt_rows = m.admit_rows;
  o.store.backend = parse_io_backend(m.io);
  o.store.cache_policy = parse_cache_policy(m.cache_policy);
  o.store.mirrors = m.mirrors;
  o.store.read_shares = parse_read_shares(m.read_shares);
  o.store.faults = IoFaults::parse_if_set(m.io_faults, "DSV4_TEST_IO_FAULTS");
  o.print_plan = true;
  return o;
}

namespace {

// --gpu: the tier computes nothing of the model yet (issue 45's first slice has the kernels and
// the device selection), so every command runs on the CPU. --gpu N checks that device N exists
// (refusing it otherwise) and says once what it is. auto and off touch no driver: loading the
// Vulkan loader and an ICD costs ~30 MB of RSS (lavapipe's LLVM; RunBatch.HugeLinesAndSpecialTokenText
// bounds the CLI's RSS), which buys nothing until the tier runs model work; `dsv4 settings`
// says which device auto would take, or why there is none.
void report_gpu(const ModelOptions& m) {
  static bool said = false;
  const gpu::Selection sel = gpu::parse_selection(m.gpu, m.gpu_mem);
  if (said || sel.mode != gpu::Selection::Mode::kIndex) return;
  said = true;
  std::string why;
  const std::vector<std::string> devices = gpu::list_devices(&why);
  if (static_cast<size_t>(sel.index) >= devices.size())
    fail("--gpu {}: {}", sel.index,
         devices.empty() ? why : fmt::format("this machine has {} device(s), numbered from 0", devices.size()));
  fmt::print(stderr, "dsv4: gpu: {}: {}; the GPU tier does not run the model yet, computing on the CPU\n", sel.index,
             devices[static_cast<size_t>(sel.index)]);
}

}  // namespace

LoadedEngine open_engine(const ModelOptions& m, const WorkloadShape& workload) {
  report_gpu(m);
  return load_engine(resolve_model_dir(m), load_options(m, workload));
}

MtpLoad mtp_load_for(const std::string& spec) {
  const SpecMode mode = parse_spec_mode(spec);
  // auto does not load it: on every model measured here MTP drafts did not pay for their
  // passes (docs/benchmarks.md); a server started with --spec mtp lets requests choose auto.
  return mode == SpecMode::kMtp ? MtpLoad::kYes : MtpLoad::kNo;
}

LoadedModel load_model(const ModelOptions& m, const WorkloadShape& workload, MtpLoad mtp) {
  const std::string dir = resolve_model_dir(m);
  LoadedModel lm{dir, {}, nullptr, text::Tokenizer::from_file(dir + "/tokenizer.json"), m.dir.empty()};
  report_gpu(m);
  LoadOptions lo = load_options(m, workload);
  lo.mtp = mtp;
  LoadedEngine loaded = load_engine(dir, lo);
  lm.plan = loaded.plan;
  lm.engine = std::move(loaded.engine);
  return lm;
}

WorkloadShape interactive_workload(const ModelOptions& m) {
  WorkloadShape w;
  w.context_tokens = m.ctx > 0 ? m.ctx : kInteractiveContextTokens;
  choose_chunk(w, m.chunk, w.context_tokens);
  return w;
}

SamplingParams sampling_params(const std::string& model_dir, const SamplingOptions& s) {
  SamplingParams p = sampling_defaults_from(model_dir + "/generation_config.json");
  if (s.temperature) p.temperature = *s.temperature;
  if (s.top_p) p.top_p = *s.top_p;
  if (s.top_k) p.top_k = *s.top_k;
  if (s.min_p) p.min_p = *s.min_p;
  if (s.repetition_penalty) p.repetition_penalty = *s.repetition_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.presence_penalty = s.presence_penalty;
  p.seed = s.seed ? *s.seed : std::random_device{}();
  p.validate();
  return p;
}

std::string expert_stats_line(const ExpertStats& s, uint64_t peak_rss) {
  return fmt::format(
      "dsv4: stats: experts {} requests, {:.1f}% hits, {} reads ({:.2f} GB at {:.2f} GB/s), {} stalls, {:.2f} s "
      "blocked on I/O; peak RSS {}",
      s.requests, 100.0 * s.hit_rate(), s.reads, s.bytes_read / 1e9, s.read_gbps(), s.stalls, s.blocked_seconds,
      format_bytes(peak_rss));
}

int64_t context_tokens(const Engine& engine, const ModelOptions& m) {
  return m.ctx > 0 ? std::min(m.ctx, engine.context_limit()) : engine.context_limit();
}

std::vector<int32_t> encode_prompt(const text::Tokenizer& tokenizer, std::string_view text,
                                   std::span<const text::TextRange> plain, int64_t limit, const std::string& what) {
  std::vector<int32_t> ids = tokenizer.encode(text, plain, static_cast<size_t>(std::max<int64_t>(limit, 0)));
  if (static_cast<int64_t>(ids.size()) >= limit)
    fail("{} has at least {} tokens, which does not fit the context limit of {} tokens (at least one token must be "
         "left to generate)", what, limit, limit);
  return ids;
}

std::string stats_line(const GenerationStats& s) {
  std::string drafts;
  if (s.drafted_tokens > 0)
    drafts = fmt::format(" | drafts {}/{} accepted ({:.0f}%), {:.2f} tok/pass", s.accepted_tokens, s.drafted_tokens,
                         100 * s.acceptance(), s.tokens_per_pass());
  return fmt::format(
      "prompt {} tok ({} reused) | TTFT {:.2f} s | prefill {:.1f} tok/s | decode {:.2f} tok/s | {} tok{} | experts hit "
      "{:.1f}% | read {:.2f} GB | peak RSS {:.2f} GB",
      s.prompt_tokens, s.reused_tokens, s.ttft_s, s.prefill_tok_s(), s.decode_tok_s(), s.generated_tokens, drafts,
      100 * s.hit_rate(), s.bytes_read / 1e9, s.peak_rss_bytes / 1e9);
}

}  // namespace dsv4::cli
