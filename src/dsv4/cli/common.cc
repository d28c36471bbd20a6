#include "dsv4/cli/common.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "dsv4/synth/synth.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4::cli {

kernels::Numerics parse_numerics(const std::string& s) {
  if (s == "reference") return kernels::Numerics::kReference;
  if (s == "fast") return kernels::Numerics::kFast;
  fail("--numerics must be \"reference\" or \"fast\", got \"{}\"", s);
}

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

std::string resolve_model_dir(const ModelOptions& m) {
  if (!m.dir.empty()) {
    if (is_directory(m.dir)) return m.dir;
    if (path_exists(m.dir)) fail("{}: is a file, not a checkpoint directory (-m takes the directory)", m.dir);
    fail("{}: no such checkpoint directory (-m)", m.dir);
  }
  std::string dir = m.demo_dir;
  if (dir.empty()) {
    const char* home = std::getenv("HOME");
    dir = std::string(home && *home ? home : "/tmp") + "/.cache/dsv4/demo";
  }
  if (path_exists(dir + "/config.json")) return dir;
  // Built in a temporary directory and renamed into place, so an interrupted or concurrent
  // first run never leaves a half-written model behind.
  fmt::print(stderr, "dsv4: creating the built-in demo model in {} (random weights, ~90 MB, once)\n", dir);
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path());
  const std::string tmp = fmt::format("{}.partial-{}", dir, getpid());
  std::filesystem::remove_all(tmp);
  SynthOptions demo = demo_synth_options(tmp);
  synthesize(demo);
  std::error_code ec;
  std::filesystem::rename(tmp, dir, ec);
  if (ec) {
    std::filesystem::remove_all(tmp);
    if (!path_exists(dir + "/config.json")) fail("{}: cannot create the demo model: {}", dir, ec.message());
  }
  return dir;
}

std::unique_ptr<Engine> open_engine(const ModelOptions& m, const WorkloadShape& workload) {
  EngineOptions eo;
  eo.numerics = parse_numerics(m.numerics);
  eo.threads = m.threads;
  eo.ram = m.ram;
  eo.workload = workload;
  eo.store.backend = parse_io_backend(m.io);
  return Engine::open(resolve_model_dir(m), eo);
}

LoadedModel load_model(const ModelOptions& m, const WorkloadShape& workload) {
  parse_ram(m.ram);  // a bad --ram fails before any work
  const std::string dir = resolve_model_dir(m);
  LoadedModel lm{dir, nullptr, text::Tokenizer::from_file(dir + "/tokenizer.json"), m.dir.empty()};
  ModelOptions resolved = m;
  resolved.dir = dir;
  lm.engine = open_engine(resolved, workload);
  return lm;
}

WorkloadShape interactive_workload(const ModelOptions& m) {
  WorkloadShape w;
  w.context_tokens = m.ctx > 0 ? m.ctx : 16384;
  w.chunk_tokens = m.chunk > 0 ? m.chunk : 256;
  return w;
}

SamplingParams sampling_params(const std::string& model_dir, const SamplingOptions& s) {
  SamplingParams p = sampling_defaults_from(model_dir + "/generation_config.json");
  if (s.temperature) p.temperature = *s.temperature;
  if (s.top_p) p.top_p = *s.top_p;
  if (s.top_k) p.top_k = *s.top_k;
  if (s.min_p) p.min_p = *s.min_p;
  if (s.repetition_penalty) p.repetition_penalty = *s.repetition_penalty;
  p.seed = s.seed ? *s.seed : std::random_device{}();
  p.validate();
  return p;
}

std::string stats_line(const GenerationStats& s) {
  return fmt::format(
      "prompt {} tok ({} reused) | TTFT {:.2f} s | prefill {:.1f} tok/s | decode {:.2f} tok/s | {} tok | experts hit "
      "{:.1f}% | read {:.2f} GB | peak RSS {:.2f} GB",
      s.prompt_tokens, s.reused_tokens, s.ttft_s, s.prefill_tok_s(), s.decode_tok_s(), s.generated_tokens,
      100 * s.hit_rate(), s.bytes_read / 1e9, s.peak_rss_bytes / 1e9);
}

}  // namespace dsv4::cli
