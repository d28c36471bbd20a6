// One generation: prefill the prompt into a session (reusing what the session already
// holds), then sample token by token until a stop condition. Text comes out through a
// callback as soon as it is final: text that could still turn into a stop string is held
// back until the match resolves either way.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/model/engine.h"
#include "dsv4/runtime/logit_constraint.h"
#include "dsv4/runtime/sampler.h"
#include "dsv4/runtime/settings.h"
#include "dsv4/runtime/speculative.h"

namespace dsv4 {

enum class FinishReason { kStop, kLength, kContextLimit, kCancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "context_limit", "cancelled"

struct GenerationRequest {
  std::vector<int32_t> prompt;            // the whole sequence the model should see
  SamplingParams sampling;
  int64_t max_tokens = setting_default<int64_t>("max_tokens");
  std::vector<int32_t> stop_ids;          // e.g. the end-of-sentence token (not emitted as text)
  std::vector<std::string> stop_strings;  // generation ends before the first occurrence
  int64_t context_limit = 0;              // 0 = the engine's context limit
  int64_t chunk = 0;                      // prefill chunk (0 = the engine's rows per pass)
  // Constrained decoding: tokens that cannot continue a valid output are masked before each
  // draw (stop_ids are allowed only where the output may end), and the generation stops as
  // soon as the output is complete. Stop strings must be empty with a constraint (a stop
  // string could cut a value short).
  std::shared_ptr<const LogitConstraint> constraint;
  // Speculative decoding (never changes the output, see speculative.h).
  SpecMode spec = SpecMode::kOff;
  int draft_max = static_cast<int>(setting_default<int64_t>("draft_max"));
  std::vector<int32_t> oracle;  // kOracle: the continuation to draft from (benchmarks)
  // Log-probabilities of the generated tokens: -1 none; n >= 0: the chosen token's and the n
  // most likely alternatives' (see TokenLogprob).
  int top_logprobs = -1;
  // Changes each step's logits before sampling (after the log-probabilities are taken, which
  // stay the model's own, and before the constraint's mask): banned tokens, forced tokens.
  // `generated`: the tokens taken so far in this generation (with drafting too: a filter sees
  // exactly what one-by-one decoding would show it).
  std::function<void(std::span<const int32_t> generated, std::span<float> logits)> logits_filter;
  // Test hook (DSV4_TEST_UNSTEERED_CONSTRAINTS): false keeps the constraint's mask of invalid
  // tokens but does not steer the answer to complete within the budget, so max_tokens cuts a
  // constrained answer as it cuts a free one, also below the answer's minimum (tests of cut
  // tool calls on a random model).
  bool steer_to_budget = true;
};

// The model's log-probability of a generated token: log-softmax of the engine's logits the
// token was drawn from (with drafting: the verify pass's row that drew it), before sampling
// settings, the logits filter and the constraint's mask; and the `top` most likely tokens
// (most likely first, lower id first on ties).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;  // prompt tokens already in the session (not prefilled again)
  int64_t prefilled_tokens = 0;  // prompt tokens fed by this generation (fewer when cancelled)
  int64_t generated_tokens = 0;
  double ttft_s = 0;      // request start to the first generated token
  double prefill_s = 0;
  double decode_s = 0;    // after the first token
  double constraint_s = 0;  // masking logits and advancing the constraint (part of ttft_s + decode_s)
  uint64_t expert_requests = 0, expert_hits = 0, bytes_read = 0;
  uint64_t peak_rss_bytes = 0;
  uint64_t seed = 0;
  // Decoding passes after the first token, and what drafting did in them.
  int64_t decode_passes = 0;
  int64_t drafted_tokens = 0, accepted_tokens = 0;
  std::vector<int64_t> drafted_at, accepted_at;  // [draft position]: drafts tried / kept

  // (Inline: the request parsers' fuzz build formats stats without linking the engine.)
  double prefill_tok_s() const { return prefill_s > 0 ? prefilled_tokens / prefill_s : 0; }
  double decode_tok_s() const { return decode_s > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_s : 0; }
  double hit_rate() const { return expert_requests ? double(expert_hits) / double(expert_requests) : 0; }
  double acceptance() const { return drafted_tokens ? double(accepted_tokens) / double(drafted_tokens) : 0; }
  // Tokens each decoding pass produced (1 without drafting).
  double tokens_per_pass() const {
    return decode_passes ? double(generated_tokens - 1) / double(decode_passes) : 0;
  }
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (a final stop id included)
  std::string text;             // the emitted text (stop string and stop ids excluded)
  FinishReason finish = FinishReason::kLength;
  std::string stop_string;      // the stop string that ended it ("" for any other end)
  // With top_logprobs >= 0: one per generated token, a final stop id excluded.
  std::vector<TokenLogprob> logprobs;
  GenerationStats stats;
};

struct GenerationCallbacks {
  // Token id -> text that became complete (an incremental detokenizer). Required.
  std::function<std::string(int32_t)> detokenize;
  // Flushes any incomplete trailing bytes at the end (optional).
  std::function<std::string()> flush;
  std::function<void(const std::string&)> on_text;                     // optional
  // Each entry of GenerationResult::logprobs as soon as its token is sampled (optional).
  std::function<void(const TokenLogprob&)> on_logprob;
  std::function<void(int64_t done, int64_t total)> on_prefill_progress;  // optional
  const std::atomic<bool>* cancel = nullptr;                           // optional
  // The logits each generated token was drawn from, in order (optional; tests, log-probs).
  std::function<void(std::span<const float>)> on_logits;
  // Prefill passes end at every multiple of snapshot_every tokens (0: where the chunks fall),
  // and on_snapshot sees the session there, before the prompt's end (optional; the prefix
  // cache's block snapshots).
  int64_t snapshot_every = 0;
  std::function<void(const SessionState&)> on_snapshot;
};

// Runs a generation in `session`. If the session's tokens are a prefix of the prompt only
// the rest is prefilled; otherwise the session is reset first. Throws Error when the
// prompt alone exceeds the context limit, and when the forward pass fails (the session is
// then rewound to where the generation started).
GenerationResult generate(Engine& engine, SessionState& session, const GenerationRequest& request,
                          const GenerationCallbacks& callbacks);

}  // namespace dsv4
