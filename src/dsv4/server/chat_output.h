// Splits the text a chat answer generates into what the OpenAI API returns: reasoning_content
// (thinking mode: everything before </think>), content, and tool calls (a DSML block at the
// end, parsed by the chat format's strict parser). It works incrementally so that streaming
// can send each piece as soon as it is final: text that could be the start of "</think>" or
// of a tool-call block is held back until the next tokens decide. Streaming and non-streaming
// responses both go through this one class, so they cannot disagree.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/text/chat_format.h"

namespace dsv4::server {

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<text::chat::ToolCall> tool_calls;  // only from finish()
  // Only from finish(cut = true): the last tool call was cut short, its arguments are the text
  // written so far (a prefix of what the whole call would give), and cut_input its parameters
  // so far as an object (see text::dsml::CutToolCalls).
  bool cut_call = false;
  text::chat::Json cut_input = nullptr;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  // thinking: the prompt ended with <think>. tools: tools were offered, so a DSML block is
  // parsed as tool calls (otherwise it is plain content). Tool call ids are id_prefix + index.
  ChatOutputParser(bool thinking, bool tools, std::string id_prefix);

  // Feeds newly generated text; returns what became final.
  ChatDelta feed(std::string_view text);
  // The end of the answer: returns the rest. `cut`: the answer did not end on its own (it hit
  // max_tokens, the context limit or a stop string), so a tool-call block still open is read as
  // the calls written so far, the last one cut (never returned as markup). A tool-call block
  // that does not parse (malformed DSML, text after it) is returned as content rather than lost.
  ChatDelta finish(bool cut = false);

 private:
  enum class Phase { kReasoning, kContent, kToolCalls };
  Phase phase_;
  bool tools_;
  std::string id_prefix_;
  std::string pending_;  // not yet final
  std::string block_;    // the tool-call block so far
};

// Rules on the answer's tokens, applied as a logits filter (GenerationRequest::logits_filter).
struct AnswerRules {
  std::vector<int32_t> banned;   // never sampled (e.g. ｜DSML｜ when tools may not be called)
  int32_t think_end = -1;        // the token that closes the reasoning (</think>)
  int64_t thinking_budget = 0;   // > 0: once the reasoning has this many tokens, think_end is forced
};
using LogitsFilter = std::function<void(std::span<const int32_t> generated, std::span<float> logits)>;
// Null when there is no rule to apply.
LogitsFilter answer_logits_filter(const AnswerRules& rules);

}  // namespace dsv4::server
