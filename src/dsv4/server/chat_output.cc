#include "dsv4/server/chat_output.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "dsv4/text/dsml.h"
#include "dsv4/util/error.h"

namespace dsv4::server {
namespace {

namespace chat = text::chat;

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(marker.size() - 1, text.size()); len > 0; --len)
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  return 0;
}

const std::string& tool_calls_start() {
  static const std::string start = text::dsml::tool_calls_start();
  return start;
}

}  // namespace

ChatOutputParser::ChatOutputParser(bool thinking, bool tools, std::string id_prefix)
    : phase_(thinking ? Phase::kReasoning : Phase::kContent), tools_(tools), id_prefix_(std::move(id_prefix)) {}

ChatDelta ChatOutputParser::feed(std::string_view text) {
  ChatDelta out;
  pending_ += text;
  const std::string& tool_start = tool_calls_start();
  for (;;) {
    if (phase_ == Phase::kReasoning) {
      const size_t at = pending_.find(chat::kThinkEnd);
      if (at != std::string::npos) {
        out.reasoning += pending_.substr(0, at);
        pending_.erase(0, at + chat::kThinkEnd.size());
        phase_ = Phase::kContent;
        continue;
      }
      const size_t keep = partial_marker_suffix(pending_, chat::kThinkEnd);
      out.reasoning += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    if (phase_ == Phase::kContent) {
      if (!tools_) {
        out.content += pending_;
        pending_.clear();
        return out;
      }
      const size_t at = pending_.find(tool_start);
      if (at != std::string::npos) {
        out.content += pending_.substr(0, at);
        block_ = pending_.substr(at);
        pending_.clear();
        phase_ = Phase::kToolCalls;
        return out;
      }
      const size_t keep = partial_marker_suffix(pending_, tool_start);
      out.content += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    block_ += pending_;
    pending_.clear();
    return out;
  }
}

ChatDelta ChatOutputParser::finish(bool cut) {
  ChatDelta out;
  switch (phase_) {
    case Phase::kReasoning:  // the model never closed its thinking (e.g. it hit max_tokens)
      out.reasoning = std::move(pending_);
      break;
    case Phase::kContent:
      // Held back as a possible tool-call start: once it has the ｜DSML｜ token it is one, cut
      // before anything of the call was written.
      if (!(cut && tools_ && pending_.find(chat::kDsml) != std::string::npos)) out.content = std::move(pending_);
      break;
    case Phase::kToolCalls: {
      chat::ParseOptions po;
      po.thinking_mode = chat::ThinkingMode::kChat;
      po.require_eos = false;  // the end-of-sentence token is a stop id, never part of the text
      po.tool_call_id_prefix = id_prefix_;
      try {
        chat::ParsedMessage m = chat::parse_completion(block_, po);
        out.content = std::move(m.content);
        out.tool_calls = std::move(m.tool_calls);
      } catch (const Error&) {
        out.content = std::move(block_);
      }
      if (!cut || !out.content.starts_with(tool_calls_start())) break;
      try {
        text::dsml::CutToolCalls calls = text::dsml::parse_cut_tool_calls(out.content, tool_calls_start().size());
        for (size_t i = 0; i < calls.calls.size(); ++i) calls.calls[i].id = id_prefix_ + std::to_string(i);
        out.content.clear();
        out.tool_calls = std::move(calls.calls);
        out.cut_call = calls.last_cut;
        if (calls.last_cut) out.cut_input = std::move(calls.last_input);
      } catch (const Error&) {
        // Malformed before the cut: content, as a malformed whole block is.
      }
      break;
    }
  }
  pending_.clear();
  block_.clear();
  phase_ = Phase::kContent;
  return out;
}

LogitsFilter answer_logits_filter(const AnswerRules& rules) {
  const bool budget = rules.thinking_budget > 0 && rules.think_end >= 0;
  if (rules.banned.empty() && !budget) return nullptr;
  // Whether the reasoning has been closed, found by scanning each generated token once.
  struct Progress {
    size_t scanned = 0;
    bool closed = false;
  };
  auto progress = std::make_shared<Progress>();
  return [rules, budget, progress](std::span<const int32_t> generated, std::span<float> logits) {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    for (int32_t id : rules.banned)
      if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] = kNever;
    if (!budget) return;
    Progress& p = *progress;
    if (generated.size() < p.scanned) p = Progress{};  // a new generation
    for (; p.scanned < generated.size(); ++p.scanned)
      if (generated[p.scanned] == rules.think_end) p.closed = true;
    if (p.closed || static_cast<int64_t>(generated.size()) < rules.thinking_budget) return;
    if (static_cast<size_t>(rules.think_end) >= logits.size()) return;
    const float keep = logits[rules.think_end];
    std::fill(logits.begin(), logits.end(), kNever);
    logits[rules.think_end] = std::isfinite(keep) ? keep : 0.0f;
  };
}

}  // namespace dsv4::server
