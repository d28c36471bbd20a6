// Turns a row of logits into the next token. Processing order follows Hugging Face's
// logits processors: repetition penalty, then OpenAI's frequency and presence penalties,
// temperature, top-k, top-p, min-p, then a draw.
// temperature == 0 means greedy (argmax, lowest id on ties). The random stream is our own
// (xoshiro256**), so the same seed gives the same tokens on every platform.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;                   // 0 = off
  float min_p = 0.0f;              // 0 = off
  float repetition_penalty = 1.0f; // 1 = off
  // OpenAI's: a token's logit drops by frequency_penalty x the times it was generated so far,
  // and by presence_penalty once if it was generated at all (prompt tokens do not count).
  float frequency_penalty = 0.0f;  // 0 = off
  float presence_penalty = 0.0f;   // 0 = off
  uint64_t seed = 0;

  // Throws Error naming the parameter when a value is out of range.
  void validate() const;
  bool greedy() const { return temperature == 0.0f; }
};

// Defaults from a checkpoint's generation_config.json (temperature, top_p, top_k,
// do_sample=false -> greedy). A missing file gives the library defaults.
SamplingParams sampling_defaults_from(const std::string& generation_config_path);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // `history`: the tokens the repetition penalty applies to (prompt + generated); the
  // frequency and presence penalties count history[prompt_tokens..], the generated ones.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, size_t prompt_tokens = 0);
  const SamplingParams& params() const { return params_; }

 private:
  double next_uniform();  // [0, 1)
  SamplingParams params_;
  uint64_t state_[4];
  std::vector<float> work_;
  std::vector<int32_t> ids_;
};

}  // namespace dsv4
