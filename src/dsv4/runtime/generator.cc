#include "dsv4/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "dsv4/model/undo_log.h"
#include "dsv4/runtime/session_mark.h"
#include "dsv4/util/error.h"
#include "dsv4/util/memory.h"
#include "dsv4/util/portable_math.h"

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

// log-softmax of `logits` at `token`, and the `top` most likely tokens, in double precision.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top, std::vector<int32_t>& ids) {
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  double sum = 0;
  for (float l : logits) sum += portable::exp(static_cast<double>(l) - max);
  const double log_z = max + portable::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(static_cast<double>(logits[id]) - log_z); };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob(token);
  const size_t n = std::min(static_cast<size_t>(top), logits.size());
  if (n > 0) {
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (size_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], logprob(ids[i]));
  }
  return out;
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
  if (req.spec == SpecMode::kMtp && !engine.has_mtp())
    fail("spec \"mtp\": the model was loaded without its MTP layer (the checkpoint has none, or it was started "
         "with another --spec)");
  const int64_t limit =
      req.context_limit > 0 ? std::min(req.context_limit, engine.context_limit()) : engine.context_limit();
  const int64_t prompt_len = static_cast<int64_t>(req.prompt.size());
  if (prompt_len >= limit)
    fail("the prompt has {} tokens, which does not fit the context limit of {} tokens (at least one token must be "
         "left to generate)", prompt_len, limit);

  // A constrained output must fit: the shortest complete one (a token per byte) within
  // max_tokens and the context left after the prompt. A prefill-only request (max_tokens 0)
  // generates nothing.
  if (req.constraint && req.max_tokens > 0) {
    const int64_t need = req.constraint->min_tokens();
    if (req.max_tokens < need && req.steer_to_budget)
      fail("max_tokens is {}, but the shortest complete answer in this format takes {} tokens: ask for at least {}",
           req.max_tokens, need, need);
    if (limit - prompt_len < need)
      fail("the context limit of {} tokens leaves {} after the prompt, but the shortest complete answer in this "
           "format takes {} tokens", limit, limit - prompt_len, need);
  }

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
  // A step that throws (a failed expert read, a non-finite value) leaves the session half
  // updated: it is rewound to where this generation started, so a caller that keeps it
  // continues from a consistent state. The mark restores every buffer a pass (a verify pass
  // with its undo log too) or the MTP's drafting may have written.
  const SessionMark start_mark = mark_session(session);
  auto rewinding = [&](auto&& step) {
    try {
      return step();
    } catch (...) {
      rewind_session(session, start_mark);
      throw;
    }
  };
  auto feed = [&](std::span<const int32_t> tokens, float* out, LogitRows rows, int64_t chunk,
                  UndoLog* undo = nullptr) {
    rewinding([&] { engine.forward(session, tokens, out, rows, chunk, undo); });
  };
  {
    // Prefill in chunks so progress can be shown. Cancellation is honoured inside a chunk's
    // pass (between blocks and experts), so Ctrl-C acts at once whatever the chunk; the
    // session is rewound to where this generation started, so a kept session (chat) goes on
    // as if the request had never come.
    const int64_t chunk = req.chunk > 0 ? std::min(req.chunk, engine.max_rows()) : engine.max_rows();
    const int64_t to_prefill = prompt_len - st.reused_tokens;
    int64_t done = st.reused_tokens;
    auto cancelled = [&] {
      rewind_session(session, start_mark);
      result.finish = FinishReason::kCancelled;
      st.prefill_s = seconds_since(start);
      finish_stats();
      return result;
    };
    if (cb.on_prefill_progress) cb.on_prefill_progress(0, to_prefill);  // the progress clock starts here
    while (done < prompt_len) {
      if (cb.cancel && cb.cancel->load()) return cancelled();
      int64_t n = std::min(chunk, prompt_len - done);
      if (cb.snapshot_every > 0) n = std::min(n, cb.snapshot_every - done % cb.snapshot_every);
      const bool last = done + n == prompt_len;
      try {
        engine.forward(session, std::span<const int32_t>(req.prompt).subspan(done, n), last ? logits.data() : nullptr,
                       LogitRows::kLast, n, nullptr, cb.cancel);
      } catch (const PassCancelled&) {
        return cancelled();
      } catch (...) {
        rewind_session(session, start_mark);
        throw;
      }
      done += n;
      st.prefilled_tokens = done - st.reused_tokens;
      if (cb.on_snapshot && cb.snapshot_every > 0 && !last && done % cb.snapshot_every == 0) cb.on_snapshot(session);
      if (cb.on_prefill_progress) cb.on_prefill_progress(st.prefilled_tokens, to_prefill);
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
  std::vector<int32_t> top_ids;  // scratch for the top log-probabilities
  std::vector<float> raw;        // the engine's logits of the row drawn from, before any filter or mask
  TokenLogprob drawn;            // the log-probability of the token draw() returned last
  // Draws the next token from `row` (the logits after the last token taken): its
  // log-probability is taken from the engine's own logits, then the logits filter and the
  // constraint's mask apply, and the constraint advances over the token drawn (every token
  // drawn is taken).
  auto draw = [&](std::span<float> row) {
    const bool changed = req.logits_filter || constraint;
    if (req.top_logprobs >= 0 && changed) raw.assign(row.begin(), row.end());
    if (req.logits_filter) req.logits_filter(result.tokens, row);
    if (constraint) {
      // The tokens this generation may still take, this one included (the context counted
      // one short, to be safe): the mask keeps a complete output within them.
      const int64_t taken = static_cast<int64_t>(result.tokens.size());
      const int64_t budget = req.steer_to_budget ? std::min(req.max_tokens, limit - prompt_len) : limit;
      constraint->mask(row, std::max<int64_t>(1, budget - taken));
    }
    if (cb.on_logits) cb.on_logits(row);
    const int32_t next = sampler.sample(row, history, req.prompt.size());
    if (constraint) constraint->advance(next);
    if (req.top_logprobs >= 0)
      drawn = token_logprob(changed ? std::span<const float>(raw) : std::span<const float>(row), next,
                            req.top_logprobs, top_ids);
    return next;
  };
  // Takes a drawn token: false when it ends the generation (result.finish says why).
  // `fed_next`: the token is the first row of the next pass (not a draft that pass already fed).
  auto take = [&](int32_t next, bool fed_next) {
    result.tokens.push_back(next);
    history.push_back(next);
    if (result.tokens.size() == 1) st.ttft_s = seconds_since(start);
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), next) != req.stop_ids.end()) {
      result.finish = FinishReason::kStop;
      return false;
    }
    if (req.top_logprobs >= 0) {
      result.logprobs.push_back(std::move(drawn));
      if (cb.on_logprob) cb.on_logprob(result.logprobs.back());
    }
    if (fed_next && static_cast<int64_t>(result.tokens.size()) < req.max_tokens)
      engine.anticipate(std::span<const int32_t>(&next, 1));  // its reads start now
    pending += cb.detokenize(next);
    for (const std::string& s : req.stop_strings) {
      size_t at = pending.find(s);
      if (at != std::string::npos) {
        pending.resize(at);
        stop_string_hit = true;
        result.stop_string = s;  // the earliest match wins: later ones must start before it
      }
    }
    if (stop_string_hit) {
      result.finish = FinishReason::kStop;
      return false;
    }
    emit(pending.size() - held_back(pending, req.stop_strings));
    if (constraint && constraint->complete()) {
      result.finish = FinishReason::kStop;
      return false;
    }
    if (static_cast<int64_t>(result.tokens.size()) >= req.max_tokens) {
      // A constrained output that is complete here (the budget made it end) is a finished
      // answer: "stop". One that is not (only where the budget is below min_tokens) is cut.
      result.finish = constraint && constraint->may_end() ? FinishReason::kStop : FinishReason::kLength;
      return false;
    }
    return true;
  };

  // Decoding. Each step feeds the last token taken plus k drafts in one pass of k + 1 rows;
  // row j's logits draw the token after row j exactly as one-by-one decoding would, so the
  // step takes drafts while they equal the tokens drawn, then one more token, and the rows
  // after the last token kept are taken back (see speculative.h).
  const SpecMode mode = req.max_tokens > 1 ? req.spec : SpecMode::kOff;
  const int draft_max =
      mode == SpecMode::kOff ? 0 : static_cast<int>(std::min<int64_t>(std::min(req.draft_max, kMaxDraftTokens), engine.max_rows() - 1));
  // One controller per drafter (their acceptance differs): n-gram / oracle, and MTP.
  DraftController controller(draft_max, /*may_stop_drafting=*/mode == SpecMode::kAuto);
  DraftController mtp_controller(engine.has_mtp() ? draft_max : 0, /*may_stop_drafting=*/mode == SpecMode::kAuto);
  std::vector<float> verified;  // [draft_max + 1, V]
  if (draft_max > 0) verified.resize(static_cast<size_t>(draft_max + 1) * V);
  std::vector<int32_t> rows(static_cast<size_t>(draft_max) + 1);
  st.drafted_at.assign(static_cast<size_t>(draft_max), 0);
  st.accepted_at.assign(static_cast<size_t>(draft_max), 0);
  // Room for a verify pass of draft_max + 1 rows, reserved once (what the planner counts).
  UndoLog undo;
  if (draft_max > 0) undo.reserve(UndoLog::most_for(c, draft_max + 1));

  bool going = req.max_tokens > 0 && !(cb.cancel && cb.cancel->load());
  if (!going && req.max_tokens > 0) result.finish = FinishReason::kCancelled;
  if (going) going = take(draw(logits), true);
  while (going) {
    if (session.position >= limit) {
      result.finish = constraint && constraint->may_end() ? FinishReason::kStop : FinishReason::kContextLimit;
      break;
    }
    if (cb.cancel && cb.cancel->load()) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    // Drafts: never more than the context, the token budget or the workspace can take. A
    // step's time includes its drafting (the MTP's passes), so the controllers weigh it.
    const auto pass_start = Clock::now();
    const int64_t room = std::min(limit - session.position, req.max_tokens - static_cast<int64_t>(result.tokens.size()));
    int k = static_cast<int>(std::clamp<int64_t>(room - 1, 0, draft_max));
    rows[0] = history.back();
    DraftController* drafter = &controller;
    if (k > 0) {
      if (mode == SpecMode::kOracle) {
        // Oracle drafts (benchmarks) measure the machinery at exactly draft_max.
        const size_t at = result.tokens.size();
        k = static_cast<int>(std::min<size_t>(static_cast<size_t>(k), req.oracle.size() > at ? req.oracle.size() - at : 0));
        std::copy_n(req.oracle.begin() + static_cast<std::ptrdiff_t>(at), k, rows.begin() + 1);
      } else {
        // auto: n-gram drafts where the last two or more tokens occurred before (repeated
        // text, where they are often right), else the MTP's.
        int matched = 0;
        const int found = mode == SpecMode::kMtp ? 0 : ngram_draft(history, k, rows.data() + 1, &matched);
        const bool use_mtp = mode == SpecMode::kMtp || (mode == SpecMode::kAuto && engine.has_mtp() && matched < 2);
        if (use_mtp) {
          drafter = &mtp_controller;
          k = mtp_controller.draft_length(k);
          k = rewinding([&] { return engine.mtp_draft(session, rows[0], k, rows.data() + 1); });
        } else {
          k = controller.draft_length(found);
        }
      }
    }
    ++st.decode_passes;
    if (k == 0) {
      feed(std::span<const int32_t>(rows.data(), 1), logits.data(), LogitRows::kLast, 0);
      if (draft_max > 0) drafter->record(1, 0, seconds_since(pass_start));
      going = take(draw(logits), true);
      continue;
    }
    undo.begin(session);
    const int64_t pass_position = session.position;
    feed(std::span<const int32_t>(rows.data(), static_cast<size_t>(k) + 1), verified.data(), LogitRows::kAll, k + 1,
         &undo);
    const double pass_s = seconds_since(pass_start);
    int kept = 0;  // rows of the pass the session keeps: the token before the drafts + drafts taken
    int accepted = 0;
    for (int j = 0; j <= k; ++j) {
      const int32_t next = draw(std::span<float>(verified.data() + static_cast<size_t>(j) * V, V));
      kept = j + 1;
      const bool right = j < k && next == rows[static_cast<size_t>(j) + 1];
      if (j < k) ++st.drafted_at[static_cast<size_t>(j)];
      if (right) ++st.accepted_at[static_cast<size_t>(j)], ++accepted;
      going = take(next, !right);
      if (!going || !right) break;
    }
    st.drafted_tokens += k;
    st.accepted_tokens += accepted;
    drafter->record(k + 1, accepted, pass_s);
    if (kept < k + 1) undo.rewind(session, pass_position + kept);
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
