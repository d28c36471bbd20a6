#include "dsv4/runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "dsv4/util/error.h"
#include "dsv4/util/memory.h"

namespace dsv4 {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Length of the longest suffix of `text` that is a proper prefix of some stop string: that
// much must be held back because the next tokens could complete a stop string.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContextLimit: return "context_limit";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

GenerationResult generate(Engine& engine, SessionState& session, const GenerationRequest& req,
                          const GenerationCallbacks& cb) {
  const ModelConfig& c = engine.config();
  const auto start = Clock::now();
  req.sampling.validate();
  if (req.max_tokens < 0) fail("max_tokens must be >= 0, got {}", req.max_tokens);
  if (req.prompt.empty()) fail("the prompt is empty");
  for (const std::string& s : req.stop_strings)
    if (s.empty()) fail("stop strings must not be empty");
  if (req.constraint && !req.stop_strings.empty()) fail("stop strings cannot be combined with a constrained output");
  const int64_t limit =
      req.context_limit > 0 ? std::min(req.context_limit, engine.context_limit()) : engine.context_limit();
  const int64_t prompt_len = static_cast<int64_t>(req.prompt.size());
  if (prompt_len >= limit)
    fail("the prompt has {} tokens, which does not fit the context limit of {} tokens (at least one token must be "
         "left to generate)", prompt_len, limit);

  GenerationResult result;
  GenerationStats& st = result.stats;
  st.prompt_tokens = prompt_len;
  st.seed = req.sampling.seed;
  const ExpertStats experts_before = engine.experts().stats();

  // Reuse the session if it holds a prefix of the prompt (it cannot rewind).
  const auto& have = session.tokens;
  bool is_prefix = have.size() < req.prompt.size() && std::equal(have.begin(), have.end(), req.prompt.begin());
  if (!is_prefix) session = engine.new_session();
  st.reused_tokens = static_cast<int64_t>(session.tokens.size());

  // What a generation read and how much memory it took, also when it stops early.
  auto finish_stats = [&] {
    const ExpertStats after = engine.experts().stats();
    st.expert_requests = after.requests - experts_before.requests;
    st.expert_hits = after.hits - experts_before.hits;
    st.bytes_read = after.bytes_read - experts_before.bytes_read;
    st.peak_rss_bytes = peak_rss_bytes();
  };

  const int64_t V = c.vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  {
    // Prefill in chunks so progress can be shown and cancellation honoured between chunks.
    const int64_t chunk = req.chunk > 0 ? std::min(req.chunk, engine.max_rows()) : engine.max_rows();
    int64_t done = st.reused_tokens;
    while (done < prompt_len) {
      if (cb.cancel && cb.cancel->load()) {
        result.finish = FinishReason::kCancelled;
        st.prefill_s = seconds_since(start);
        finish_stats();
        return result;
      }
      const int64_t n = std::min(chunk, prompt_len - done);
      const bool last = done + n == prompt_len;
      engine.forward(session, std::span<const int32_t>(req.prompt).subspan(done, n), last ? logits.data() : nullptr,
                     LogitRows::kLast, n);
      done += n;
      st.prefilled_tokens = done - st.reused_tokens;
      if (cb.on_prefill_progress) cb.on_prefill_progress(done - st.reused_tokens, prompt_len - st.reused_tokens);
    }
  }
  st.prefill_s = seconds_since(start);

  Sampler sampler(req.sampling);
  std::unique_ptr<ConstrainedRun> constraint = req.constraint ? req.constraint->begin(req.stop_ids) : nullptr;
  std::vector<int32_t> history(req.prompt);
  std::string pending;  // decoded text not yet emitted
  auto emit = [&](size_t n) {
    if (n == 0) return;
    std::string out = pending.substr(0, n);
    pending.erase(0, n);
    result.text += out;
    if (cb.on_text) cb.on_text(out);
  };
  const auto decode_start = Clock::now();
  result.finish = FinishReason::kLength;
  bool stop_string_hit = false;
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    if (cb.cancel && cb.cancel->load()) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    if (constraint) constraint->mask(logits);
    const int32_t next = sampler.sample(logits, history);
    if (constraint) constraint->advance(next);
    result.tokens.push_back(next);
    history.push_back(next);
    if (result.tokens.size() == 1) st.ttft_s = seconds_since(start);
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), next) != req.stop_ids.end()) {
      result.finish = FinishReason::kStop;
      break;
    }
    pending += cb.detokenize(next);
    for (const std::string& s : req.stop_strings) {
      size_t at = pending.find(s);
      if (at != std::string::npos) {
        pending.resize(at);
        stop_string_hit = true;
      }
    }
    if (stop_string_hit) {
      result.finish = FinishReason::kStop;
      break;
    }
    emit(pending.size() - held_back(pending, req.stop_strings));
    if (constraint && constraint->complete()) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (i + 1 == req.max_tokens) break;
    if (session.position >= limit) {
      result.finish = FinishReason::kContextLimit;
      break;
    }
    engine.forward(session, std::span<const int32_t>(&next, 1), logits.data(), LogitRows::kLast);
  }
  // Text held back for a stop string that never completed is final now; so are the bytes of
  // an incomplete character. After a stop string, nothing more is emitted.
  if (!stop_string_hit && cb.flush) pending += cb.flush();
  emit(pending.size());
  st.decode_s = result.tokens.size() > 1 ? seconds_since(decode_start) : 0;
  if (constraint) st.constraint_s = constraint->seconds();
  st.generated_tokens = static_cast<int64_t>(result.tokens.size());
  finish_stats();
  return result;
}

}  // namespace dsv4
