// The DeepSeek-V4 chat format (no Jinja template ships with the model): OpenAI-style messages →
// prompt text, and generated text → reasoning, content and tool calls. The rules and every fixed
// text are those of the official encoding/encoding_dsv4.py (spec §5.2); the golden tests in
// tests/chat_format_test.cc are the official encoding/tests examples.
//
// Messages are nlohmann::ordered_json (key order matters: tool schemas are written back in their
// original order). Message fields read: role (system | user | assistant | tool | developer |
// latest_reminder), content, reasoning_content (alias: reasoning), tool_calls (OpenAI form),
// tool_call_id, tools (OpenAI form, on system/developer messages), response_format, task
// (action | query | authority | domain | title | read_url), wo_eos.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsv4/text/tokenizer.h"

namespace dsv4::text::chat {

// The special-token texts of the format (the tokenizer maps them to ids by text).
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";

enum class ThinkingMode { kChat, kThinking };
enum class ReasoningEffort { kDefault, kHigh, kMax };  // kDefault = none given

struct EncodeOptions {
  ThinkingMode thinking_mode = ThinkingMode::kChat;
  // Drop reasoning_content of assistant turns before the last user/developer message (and drop
  // developer messages before it). Only in thinking mode; turned off when any message has tools.
  bool drop_thinking = true;
  ReasoningEffort reasoning_effort = ReasoningEffort::kDefault;  // kMax adds the fixed preamble
  bool add_bos = true;  // begin with <｜begin▁of▁sentence｜> (never when a context is given)
};

using Json = nlohmann::ordered_json;

// A prompt's text and which of its bytes are the caller's: message contents, reasoning, tool
// names, arguments and results, tool definitions, response schemas. Only the format's own text
// may hold control tokens, so the tokenizer reads the caller's ranges as plain text
// (Tokenizer::encode(text, caller)): a user who writes "<｜User｜>" gets ordinary tokens.
struct Prompt {
  std::string text;
  std::vector<TextRange> caller;  // sorted, disjoint, non-empty

  void add_template(std::string_view s) { text += s; }
  void add_caller(std::string_view s);
  void add(const Prompt& p);
};

// The prompt for `messages` (a JSON array). `context` = earlier messages whose text the caller
// already has (e.g. a cached prefix): they steer the rules but are not rendered. Throws Error for
// messages the official encoder would refuse (unknown role/task, developer without content, ...).
Prompt render_prompt(const Json& messages, const EncodeOptions& options, const Json& context = Json::array());
// Where the format's own `token` (e.g. kUser) last occurs in `p`, never inside the caller's
// text; npos if nowhere.
size_t last_template_token(const Prompt& p, std::string_view token);

// render_prompt's text alone (what the official encoder returns; the golden tests compare it).
std::string encode_messages(const Json& messages, const EncodeOptions& options, const Json& context = Json::array());

// Puts OpenAI request-level `tools` where the format expects them: on the first message if it is
// a system message, otherwise on a new empty system message in front.
Json attach_tools(const Json& messages, const Json& tools);
// The same for a response format (the schema the answer must follow): the format writes it as
// "## Response Format: … You MUST strictly adhere to the following schema to reply:" + JSON.
Json attach_response_format(const Json& messages, const Json& format);

// The fixed "## Tools" block for a list of OpenAI tools ({"type":"function","function":{...}});
// the function definitions are caller text.
Prompt render_tools(const Json& tools);

// Which special tokens a generated answer shows as text (for IncrementalDecoder): those its
// structure is read from, i.e. in thinking mode the first </think> (the end of the reasoning)
// and, when tools were offered, ｜DSML｜ (tool calls). Any other special token the model samples
// (<｜Assistant｜>, <｜User｜>, a second </think>, ...) is left out: no user sees control tokens.
IncrementalDecoder::ShowSpecial answer_specials(const Tokenizer& tokenizer, ThinkingMode mode, bool tools);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
  // {"role":"assistant","content":…,"reasoning_content":…,"tool_calls":[{id,type:"function",function:{name,arguments}}]}
  Json to_json() const;
};

struct ParseOptions {
  ThinkingMode thinking_mode = ThinkingMode::kChat;
  // The official parser requires the text to end with <｜end▁of▁sentence｜> (or with a complete
  // tool-call block). false also accepts plain text cut off without it (generation hit a limit).
  bool require_eos = true;
  std::string tool_call_id_prefix = "call_";  // ids are prefix + index
};

// Parses text the model generated after the prompt (after "<think>" in thinking mode, after
// "</think>" in chat mode). Strict: malformed DSML markup, text after the end, or special tokens
// inside the reasoning or content throw Error with the reason.
ParsedMessage parse_completion(std::string_view text, const ParseOptions& options);

}  // namespace dsv4::text::chat
