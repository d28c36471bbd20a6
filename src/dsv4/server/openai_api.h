// The OpenAI wire format: request bodies are parsed and validated field by field into an
// ApiRequest (what the engine needs), and responses and stream chunks are built here. Every
// check names the offending field in the error's `param`; nothing here touches the engine.
//
// A JSON response format or a required tool call makes the answer constrained (see
// OutputConstraint): the server compiles the schemas (constrain/) and masks every token that
// cannot continue a valid answer, so a finished answer always parses and validates. Explicit
// stop strings are refused then (they could cut a value short; the default ones are dropped).
//
// Accepted request fields (anything else is ignored, as OpenAI-compatible servers commonly do):
//   both endpoints  model (required), stream, stream_options.include_usage, max_tokens,
//                   temperature [0, 2], top_p (0, 1], seed, stop (string or up to 4 strings),
//                   n [1, 16] (choices forked from one prefill: choice i is what seed + i gives
//                   alone), frequency_penalty / presence_penalty [-2, 2] (OpenAI's: over the
//                   tokens generated so far), user;
//                   extensions: top_k, min_p, repetition_penalty, ignore_eos (keep generating
//                   past the end-of-sentence token, as vLLM's extension: benchmarks, tests),
//                   spec (off | auto | ngram) and draft_max [1, 16]: speculative decoding
//   chat            messages (system | developer | user | assistant | tool; content as a string
//                   or text parts; assistant reasoning_content (alias reasoning) and tool_calls;
//                   tool_call_id),
//                   max_completion_tokens, tools (function tools), tool_choice (auto | none |
//                   required | {"type": "function", "function": {"name"}}), parallel_tool_calls,
//                   response_format (text | json_object | json_schema {name, schema, strict}),
//                   logprobs, top_logprobs (0..20: the model's own log-probabilities, before
//                   sampling settings and any constraint);
//                   thinking: reasoning_effort (none | minimal -> off; low | medium | high ->
//                   on; max | xhigh -> on with the "max" preamble), thinking (bool or
//                   {"type": "enabled" | "disabled"}), chat_template_kwargs.thinking /
//                   .enable_thinking (bool); the most specific one wins; default off
//   completions     prompt (a string, which gets the BOS token in front, or token ids; one
//                   prompt per request), echo (false only), suffix (empty only), best_of (1),
//                   logprobs (0..20 alternatives)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/server/api_error.h"
#include "dsv4/server/request_fields.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/runtime/settings.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::server {

// Bounds on what one request may contain (the body size itself is bounded by the HTTP layer).
struct RequestLimits {
  size_t max_depth = 64;  // JSON nesting (deeper documents are refused before parsing)
  // JSON values kept from the fields an endpoint reads (each costs ~100 bytes as a DOM node;
  // fields it does not read are skipped while parsing and cost nothing).
  size_t max_json_values = size_t{1} << 18;
  size_t max_messages = 4096;
  size_t max_tools = 128;
  size_t max_stop = 4;
  size_t max_stop_bytes = 256;
  size_t max_model_bytes = 256;
  int64_t max_tokens = int64_t{1} << 30;
  size_t max_choices = 16;  // n
};

// A request body as JSON. 400 for a body that is not UTF-8 (with the byte offset), too deeply
// nested, not JSON (with the position), not an object, or with more than max_json_values
// values in the kept fields. With `fields`, top-level members not named there are syntax-checked
// and skipped without being built, so the memory a body costs is bounded by what the endpoint
// uses, not by what a client sends.
Json parse_json_body(std::string_view body, const RequestLimits& limits = {}, const FieldList* fields = nullptr);

// What parse_chat_request / parse_completion_request read (they throw std::logic_error when
// they read a top-level field missing here, so the lists cannot fall behind the parsers).
const FieldList& chat_request_fields();
const FieldList& completion_request_fields();

// What the server uses for fields a request leaves out.
struct RequestDefaults {
  SamplingParams sampling;        // its seed is not used
  std::optional<uint64_t> seed;   // fixed seed for requests without one; none: random per request
  int64_t max_tokens = setting_default<int64_t>("max_tokens");
  std::vector<std::string> stop;  // for requests without "stop"
  int32_t vocab_size = 0;         // token prompts must be below this
  SpecMode spec = SpecMode::kOff;  // --spec / --draft-max: for requests without "spec" / "draft_max"
  bool mtp_loaded = false;         // the engine has the MTP drafter ("spec": "mtp" is allowed)
  int draft_max = static_cast<int>(setting_default<int64_t>("draft_max"));
};

enum class ApiKind { kChat, kCompletion, kMessages };  // kMessages: Anthropic /v1/messages

// Tool use the client allows or demands (OpenAI and Anthropic tool_choice). Forced use (kAny,
// kTool) becomes an OutputConstraint with calls_required.
struct ToolChoice {
  enum class Mode { kAuto, kNone, kAny, kTool };
  Mode mode = Mode::kAuto;
  std::string name;      // kTool: the tool that must be called
  bool parallel = true;  // false: one call at most (Anthropic disable_parallel_tool_use)
};

// What a constrained answer must be (inactive: free text).
struct OutputConstraint {
  std::optional<Json> content_schema;  // the content is JSON valid for this schema
  std::string content_param;           // the request field it came from (errors name it)
  // "strict": false drops the assertions the compiler cannot enforce instead of refusing
  // them (absent means true: an answer is never silently less constrained than asked).
  bool content_strict = true;
  struct Tool {
    std::string name;
    std::optional<Json> parameters;
    std::string param;  // "tools[2].function.parameters"
    bool strict = true;
  };
  std::vector<Tool> tools;  // calls the answer may make (must, with calls_required)
  bool calls_required = false;
  size_t max_calls = 1;
  bool active() const { return content_schema.has_value() || calls_required; }
};

// The grammar description for `c` (it points into `c`, which must outlive it).
constrain::AnswerFormat answer_format(const OutputConstraint& c, bool thinking);

// Invokes in one forced tool-call block when parallel_tool_calls is allowed.
inline constexpr size_t kMaxParallelToolCalls = 8;

struct ApiRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;
  bool stream = false;
  bool include_usage = false;
  // The prompt: text whose tokenization is the prompt (the chat-encoded conversation, or BOS
  // + the completion prompt), or token ids (completions; prompt_text is then empty).
  std::string prompt_text;
  // The caller's text in prompt_text (messages, tool definitions, a completion's prompt): read
  // as plain text, so special-token text there never becomes a control token.
  std::vector<text::TextRange> prompt_caller;
  std::vector<int32_t> prompt_ids;
  // Chat: bytes of prompt_text before the last user/tool turn, i.e. the history that the
  // next turn of this conversation will repeat (0: none).
  size_t history_bytes = 0;
  // Completions, "special_tokens": true: special-token text in the prompt is control tokens and
  // generated special tokens are returned as text (by default neither).
  bool special_tokens = false;
  bool thinking = false;  // the answer starts with reasoning, closed by </think>
  bool tools = false;     // the answer may end with DSML tool calls, parsed as such
  bool no_tool_calls = false;  // tools are in the prompt but may not be called (DSML banned)
  ToolChoice tool_choice;
  int64_t thinking_budget = 0;  // > 0: the reasoning is closed after this many tokens
  int top_logprobs = -1;        // -1: no log-probabilities; n >= 0: chosen token + n alternatives
  SamplingParams sampling;
  std::optional<uint64_t> seed;  // choice i of n samples with seed + i (mod 2^64)
  int n = 1;                      // choices (OpenAI endpoints; Anthropic's has none)
  int64_t max_tokens = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  OutputConstraint output;
  SpecMode spec = SpecMode::kOff;  // speculative decoding (never changes the answer)
  int draft_max = 1;
};

ApiRequest parse_chat_request(const Json& body, const RequestDefaults& defaults, const RequestLimits& limits = {});
// Sets a chat request's prompt_text, prompt_caller and history_bytes (OpenAI and Anthropic).
void set_chat_prompt(ApiRequest& r, text::chat::Prompt p);
ApiRequest parse_completion_request(const Json& body, const RequestDefaults& defaults,
                                    const RequestLimits& limits = {});

// ---- responses -----------------------------------------------------------------------------

struct ResponseHeader {
  std::string id;       // "chatcmpl-…" / "cmpl-…"
  int64_t created = 0;  // unix seconds
  std::string model;
};

// "stop" | "length" | "tool_calls" (a cancelled generation has no client left to tell).
std::string finish_reason_text(FinishReason reason, bool tool_calls);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}
Json usage_json(const GenerationStats& stats);
// Non-standard per-answer timings (clients ignore unknown fields): ttft_s, prefill/decode tok/s, ...
Json stats_json(const GenerationStats& stats, double queue_s);

// The assistant message of a chat answer (reasoning, content, tool calls).
struct ChatAnswer {
  std::string reasoning;
  std::string content;
  std::vector<text::chat::ToolCall> tool_calls;
  bool cut_call = false;  // the last tool call was cut short (ChatDelta::cut_call)
  Json cut_input = nullptr;  // its parameters so far (Anthropic's tool_use input)
};
Json tool_calls_json(const std::vector<text::chat::ToolCall>& calls, bool with_index);

// Usage of the choices of one request: the prompt (and what the cache held of it) once, as
// the first choice saw it, and the completion tokens of all.
GenerationStats choices_usage(std::span<const GenerationStats* const> choices);

// `logprobs`: null, or chat_logprobs_json / completion_logprobs_json.
Json chat_choice_json(size_t index, const ChatAnswer& answer, bool thinking, const std::string& finish,
                      Json logprobs = nullptr);
// `choices`: an array of chat_choice_json.
Json chat_completion_json(const ResponseHeader& h, Json choices, Json usage, Json stats);
// One "chat.completion.chunk" of choice `index`; an empty `finish` is sent as null.
Json chat_chunk_json(const ResponseHeader& h, Json delta, const std::string& finish, Json logprobs = nullptr,
                     size_t index = 0);
Json completion_choice_json(size_t index, const std::string& text, const std::string& finish, Json logprobs = nullptr);
// `choices`: an array of completion_choice_json.
Json completion_json(const ResponseHeader& h, Json choices, Json usage, Json stats);
Json completion_chunk_json(const ResponseHeader& h, const std::string& text, const std::string& finish,
                           Json logprobs = nullptr, size_t index = 0);
// The last chunk of a stream with include_usage: no choices, the usage.
Json usage_chunk_json(ApiKind kind, const ResponseHeader& h, Json usage, Json stats);

// Log-probabilities in OpenAI's shapes. A token's text is its raw bytes, or "bytes:\\xNN..." when
// they are not valid UTF-8 on their own (part of a character), as OpenAI writes it.
std::string logprob_token_text(const text::Tokenizer& tokenizer, int32_t id);
// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}.
Json chat_logprobs_json(std::span<const TokenLogprob> logprobs, const text::Tokenizer& tokenizer);
// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"};
// offsets count bytes of token text from `offset`.
Json completion_logprobs_json(std::span<const TokenLogprob> logprobs, const text::Tokenizer& tokenizer,
                              size_t offset = 0);


std::string sse_event(const Json& j);

}  // namespace dsv4::server
