#include "dsv4/cli/common.h"

#include <random>

#include <fmt/format.h>

#include "dsv4/runtime/settings.h"
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
  if (!m.dir.empty()) return m.dir;
  fail("no model given: pass -m DIR (a DeepSeek V4 checkpoint directory)");
}

std::unique_ptr<Engine> open_engine(const ModelOptions& m) {
  EngineOptions eo;
  eo.numerics = parse_numerics(m.numerics);
  eo.threads = m.threads;
  return Engine::open(resolve_model_dir(m), eo);
}

LoadedModel load_model(const ModelOptions& m) {
  LoadedModel lm{resolve_model_dir(m), nullptr, text::Tokenizer::from_file(resolve_model_dir(m) + "/tokenizer.json"), m.dir.empty()};
  lm.engine = open_engine(m);
  return lm;
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
