#include "dsv4/server/chat_output.h"

#include <algorithm>

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

}  // namespace

ChatOutputParser::ChatOutputParser(bool thinking, bool tools, std::string id_prefix)
    : phase_(thinking ? Phase::kReasoning : Phase::kContent), tools_(tools), id_prefix_(std::move(id_prefix)) {}

ChatDelta ChatOutputParser::feed(std::string_view text) {
  ChatDelta out;
  pending_ += text;
  static const std::string tool_start = text::dsml::tool_calls_start();
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

ChatDelta ChatOutputParser::finish() {
  ChatDelta out;
  switch (phase_) {
    case Phase::kReasoning:  // the model never closed its thinking (e.g. it hit max_tokens)
      out.reasoning = std::move(pending_);
      break;
    case Phase::kContent:
      out.content = std::move(pending_);
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
      break;
    }
  }
  pending_.clear();
  block_.clear();
  phase_ = Phase::kContent;
  return out;
}

}  // namespace dsv4::server
