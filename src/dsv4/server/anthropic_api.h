// The Anthropic Messages API wire format (POST /v1/messages and /v1/messages/count_tokens), as
// Claude-style clients speak it: a request body is validated field by field into the same
// ApiRequest the OpenAI endpoints produce (the conversation in the official DeepSeek-V4
// encoding), and responses, stream events and errors are built in Anthropic's shapes. Nothing
// here touches the engine or the HTTP library.
//
// Accepted request fields (anything else is ignored, as Anthropic-compatible servers commonly do):
//   model (required), max_tokens (required, except for count_tokens), messages (user |
//   assistant; content a string or blocks: text, tool_result with string or block content (a
//   non-text block is written "[Unsupported <type>]", as the official encoder does) and
//   is_error; assistant text, thinking, redacted_thinking (not shown to the model: its text is
//   encrypted), tool_use; a last assistant message is a prefill the answer continues), system
//   (a string or text blocks), tools (custom tools: name, description, input_schema),
//   tool_choice (auto | any | tool with name | none; disable_parallel_tool_use), stop_sequences,
//   stream, temperature [0, 1], top_p, top_k, thinking ({"type": "enabled", "budget_tokens" >=
//   1024 and < max_tokens} | {"type": "disabled"} | {"type": "adaptive"}), metadata.user_id;
//   cache_control on any block is accepted (every prefix is cached anyway).
// Tool choice: "none" keeps the tools in the prompt (so the prefix cache still matches the
// conversation's other turns) and bans the tool-call token; "any" and "tool" constrain the answer
// to a tool-call block (of any tool, or of that tool alone, once) whose inputs follow the tools'
// input_schema (ApiRequest::output, as OpenAI's tool_choice "required" / a named function: see
// docs/constrained-decoding.md), which like Anthropic's API needs thinking off; stop_sequences are
// refused with them (they could cut an input short).
#pragma once

#include <string>

#include "dsv4/server/api_error.h"
#include "dsv4/server/chat_output.h"
#include "dsv4/server/openai_api.h"

namespace dsv4::server::anthropic {

// The top-level fields parse_messages_request reads (the body parser skips the others unbuilt).
const FieldList& messages_request_fields();

// A Messages (or count_tokens) body -> the request the engine runs. 400s name the field with
// its path, e.g. "messages[1].content[0].tool_use_id".
ApiRequest parse_messages_request(const Json& body, const RequestDefaults& defaults, const RequestLimits& limits = {},
                                  bool count_tokens = false);

// ---- errors ----------------------------------------------------------------------------------

// Anthropic's error type for an HTTP status: invalid_request_error (400, 405, 415, ...),
// authentication_error (401), permission_error (403), not_found_error (404),
// request_too_large (413), rate_limit_error (429), overloaded_error (503, 529), api_error (5xx).
std::string error_type(int status);
// {"type": "error", "error": {"type": ..., "message": ...}}
Json error_json(const ApiError& e);
std::string error_body(const ApiError& e);

// ---- responses -------------------------------------------------------------------------------

// "end_turn" | "max_tokens" | "stop_sequence" | "tool_use" (a cancelled answer reaches nobody).
std::string stop_reason(FinishReason reason, const std::string& stop_string, bool tool_use);

// {"input_tokens" (not read from the cache), "cache_creation_input_tokens": 0,
//  "cache_read_input_tokens", "output_tokens"}
Json usage_json(const GenerationStats& stats);

// The content blocks of an answer: thinking (when thinking was on), text, tool_use.
Json content_json(const ChatAnswer& answer, bool thinking);

// A whole "message" object. `stop_string`: the stop sequence that ended it, or "".
Json message_json(const ResponseHeader& h, const ChatAnswer& answer, bool thinking, const std::string& stop_reason,
                  const std::string& stop_string, Json usage);

// "event: <type>\ndata: <json>\n\n", the type taken from the event's own "type".
std::string sse_event(const Json& event);

// A streamed answer as Anthropic's event sequence: message_start, ping, then per block
// content_block_start / content_block_delta (thinking_delta, text_delta, input_json_delta) /
// content_block_stop, then message_delta (stop_reason, usage) and message_stop. The blocks
// are those content_json gives for the same answer, in the same order.
class StreamEncoder {
 public:
  StreamEncoder(ResponseHeader header, bool thinking);

  // message_start (with the usage known once the answer starts: input and cached tokens) + ping.
  std::string start(const Json& usage);
  // Text that became final (ChatOutputParser::feed; tool calls come from its finish()).
  std::string delta(const ChatDelta& d);
  // The rest of the answer, message_delta and message_stop.
  std::string finish(const ChatDelta& rest, const std::string& stop_reason, const std::string& stop_string,
                     const Json& usage);
  // An error after the 200 was sent: an "error" event.
  static std::string error(const ApiError& e);

 private:
  enum class Block { kNone, kThinking, kText };
  std::string open(Block kind);
  std::string close();
  void ensure_thinking_block(std::string& out);

  ResponseHeader header_;
  bool thinking_;
  Block open_ = Block::kNone;
  int next_index_ = 0;  // index of the next content block
  bool thinking_done_ = false;
};

}  // namespace dsv4::server::anthropic
