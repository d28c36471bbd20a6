#include "dsv4/server/anthropic_api.h"

#include <cctype>
#include <set>

#include <fmt/format.h>

#include "dsv4/server/request_fields.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/util/error.h"

namespace dsv4::server::anthropic {
namespace {

namespace chat = text::chat;

constexpr size_t kMaxStopSequences = 64;  // Anthropic documents no bound; ours keeps matching cheap
constexpr size_t kMaxIdBytes = 256;       // tool_use ids
constexpr int64_t kMinThinkingBudget = 1024;  // Anthropic's floor for budget_tokens

// Anthropic tool names: 1 to 128 letters, digits, '_' or '-'.
bool valid_tool_name(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

std::string block_type(const Fields& block) {
  if (!block.find("type")) missing(block.name("type"));
  return *block.string("type");
}

// System: a string, or text blocks (joined: they are one system prompt).
std::string parse_system(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type("system", "a string or an array of text blocks", v);
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = at_index("system", i);
    if (!v[i].is_object()) wrong_type(p, "an object", v[i]);
    Fields block(v[i], p);
    if (block_type(block) != "text") unsupported(block.name("type"), "system blocks must be \"text\".");
    if (!block.find("text")) missing(block.name("text"));
    out += *block.string("text");
    block.object("cache_control");
  }
  return out;
}

// Tool result content: a string, or blocks joined as the official encoder joins a tool_result's
// parts ("\n\n"), where a block other than text (a tool's screenshot, say) is written
// "[Unsupported <type>]" as the official encoder writes it: an agent cannot choose what its tools
// return, so the conversation goes on.
std::string tool_result_content(const Fields& block) {
  const Json* c = block.find("content");
  if (!c) return "";
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) wrong_type(block.name("content"), "a string or an array of text blocks", *c);
  std::string out;
  for (size_t i = 0; i < c->size(); ++i) {
    const std::string p = at_index(block.name("content"), i);
    if (!(*c)[i].is_object()) wrong_type(p, "an object", (*c)[i]);
    Fields part((*c)[i], p);
    const std::string type = block_type(part);
    if (i > 0) out += "\n\n";
    if (type != "text") {
      out += "[Unsupported " + type + "]";
      continue;
    }
    if (!part.find("text")) missing(part.name("text"));
    out += *part.string("text");
  }
  return out;
}

// Calls fn(block, type) for each content block of an array, with the checks every block needs.
template <typename Fn>
void for_each_block(const Json& content, const std::string& param, Fn fn) {
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = at_index(param, i);
    if (!content[i].is_object()) wrong_type(p, "an object", content[i]);
    Fields block(content[i], p);
    const std::string type = block_type(block);
    block.object("cache_control");  // accepted: every prefix is cached anyway
    fn(block, type);
  }
}

// One Anthropic message -> messages of the chat encoder (OpenAI-style): a user message becomes
// user and tool messages in block order (the encoder merges them into one user turn), an
// assistant message one assistant message with reasoning, content and tool calls.
// `tool_use_ids`: the ids of the conversation's tool_use blocks so far (each unique and
// non-empty; a tool_result answers one of them).
void convert_message(const Json& m, const std::string& p, bool last, Json& out, bool& prefill,
                     std::set<std::string>& tool_use_ids) {
  if (!m.is_object()) wrong_type(p, "an object", m);
  Fields msg(m, p);
  if (!msg.find("role")) missing(msg.name("role"));
  const std::string role = *msg.string("role");
  if (role != "user" && role != "assistant")
    bad_value(msg.name("role"), fmt::format("expected \"user\" or \"assistant\", got \"{}\".", role));
  const Json& content = msg.require("content");
  if (!content.is_string() && !content.is_array()) wrong_type(msg.name("content"), "a string or an array of content blocks", content);

  if (role == "user") {
    if (content.is_string()) {
      out.push_back({{"role", "user"}, {"content", content}});
      return;
    }
    if (content.empty()) bad_value(msg.name("content"), "a user message needs at least one content block.");
    for_each_block(content, msg.name("content"), [&](const Fields& block, const std::string& type) {
      if (type == "text") {
        if (!block.find("text")) missing(block.name("text"));
        out.push_back({{"role", "user"}, {"content", *block.string("text")}});
      } else if (type == "tool_result") {
        if (!block.find("tool_use_id")) missing(block.name("tool_use_id"));
        const std::string id = *block.string("tool_use_id", kMaxIdBytes);
        if (id.empty()) bad_value(block.name("tool_use_id"), "a tool_use_id may not be empty.");
        if (!tool_use_ids.count(id))
          bad_value(block.name("tool_use_id"), fmt::format("no earlier tool_use block has the id \"{}\".", id));
        block.boolean("is_error");  // accepted; the format has no error flag (the text says it)
        out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", tool_result_content(block)}});
      } else {
        unsupported(block.name("type"),
                    fmt::format("user messages may hold \"text\" and \"tool_result\" blocks, got \"{}\".", type));
      }
    });
    return;
  }

  Json assistant = {{"role", "assistant"}};
  std::string text, reasoning;
  Json calls = Json::array();
  if (content.is_string()) {
    text = content.get<std::string>();
  } else {
    for_each_block(content, msg.name("content"), [&](const Fields& block, const std::string& type) {
      if (type == "text") {
        if (!block.find("text")) missing(block.name("text"));
        text += *block.string("text");
      } else if (type == "thinking") {
        if (!block.find("thinking")) missing(block.name("thinking"));
        reasoning += *block.string("thinking");
        block.string("signature");
      } else if (type == "redacted_thinking") {
        block.string("data");  // encrypted reasoning of another model: nothing to show this one
      } else if (type == "tool_use") {
        if (!block.find("id")) missing(block.name("id"));
        const std::string id = *block.string("id", kMaxIdBytes);
        if (id.empty()) bad_value(block.name("id"), "a tool_use id may not be empty.");
        if (!tool_use_ids.insert(id).second)
          bad_value(block.name("id"), fmt::format("tool_use ids must be unique in the conversation; \"{}\" is given twice.", id));
        if (!block.find("name")) missing(block.name("name"));
        const std::string name = *block.string("name");
        if (!valid_tool_name(name)) bad_value(block.name("name"), "a tool name is 1 to 128 letters, digits, '_' or '-'.");
        const Json* input = block.object("input");
        if (!input) missing(block.name("input"));
        calls.push_back({{"id", id},
                         {"type", "function"},
                         {"function", {{"name", name}, {"arguments", input->dump(-1, ' ', false, Json::error_handler_t::replace)}}}});
      } else {
        unsupported(block.name("type"), fmt::format("assistant messages may hold \"text\", \"thinking\", "
                                                    "\"redacted_thinking\" and \"tool_use\" blocks, got \"{}\".",
                                                    type));
      }
    });
  }
  assistant["content"] = text;
  if (!reasoning.empty()) assistant["reasoning_content"] = reasoning;
  if (!calls.empty()) assistant["tool_calls"] = std::move(calls);
  if (last) {
    // A prefill: the answer continues this text, so the turn is left open.
    if (!assistant["tool_calls"].is_null())
      bad_value(msg.name("content"), "a final (prefilled) assistant message cannot contain tool_use blocks.");
    assistant["wo_eos"] = true;
    prefill = true;
  }
  out.push_back(std::move(assistant));
}

Json parse_tools(const Fields& f, const RequestLimits& limits, std::set<std::string>& names) {
  const Json* tools = f.array("tools");
  Json out = Json::array();
  if (!tools) return out;
  if (tools->size() > limits.max_tools) bad_value("tools", fmt::format("at most {} tools are allowed.", limits.max_tools));
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string p = at_index("tools", i);
    if (!(*tools)[i].is_object()) wrong_type(p, "an object", (*tools)[i]);
    Fields tool((*tools)[i], p);
    if (auto type = tool.string("type"); type && *type != "custom")
      unsupported(tool.name("type"), fmt::format("only custom tools (with an input_schema) are supported, got \"{}\".", *type));
    if (!tool.find("name")) missing(tool.name("name"));
    const std::string name = *tool.string("name");
    if (!valid_tool_name(name)) bad_value(tool.name("name"), "a tool name is 1 to 128 letters, digits, '_' or '-'.");
    if (!names.insert(name).second) bad_value(tool.name("name"), fmt::format("tool names must be unique; \"{}\" is given twice.", name));
    const auto description = tool.string("description");
    const Json* schema = tool.object("input_schema");
    if (!schema) missing(tool.name("input_schema"));
    tool.object("cache_control");
    const auto strict = tool.boolean("strict");
    Json function = {{"name", name}};
    if (description) function["description"] = *description;
    function["parameters"] = *schema;
    if (strict) function["strict"] = *strict;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

ToolChoice parse_tool_choice(const Fields& f, const std::set<std::string>& tools) {
  ToolChoice choice;
  const Json* v = f.object("tool_choice");
  if (!v) return choice;
  Fields c(*v, "tool_choice");
  const std::string type = block_type(c);
  if (type == "auto") choice.mode = ToolChoice::Mode::kAuto;
  else if (type == "any") choice.mode = ToolChoice::Mode::kAny;
  else if (type == "tool") choice.mode = ToolChoice::Mode::kTool;
  else if (type == "none") choice.mode = ToolChoice::Mode::kNone;
  else bad_value("tool_choice.type", fmt::format("expected \"auto\", \"any\", \"tool\" or \"none\", got \"{}\".", type));
  choice.parallel = !c.boolean("disable_parallel_tool_use").value_or(false);
  if (choice.mode == ToolChoice::Mode::kTool) {
    if (!c.find("name")) missing("tool_choice.name");
    choice.name = *c.string("name");
    if (!tools.count(choice.name))
      bad_value("tool_choice.name", fmt::format("no tool named \"{}\" is in 'tools'.", choice.name));
  }
  if ((choice.mode == ToolChoice::Mode::kAny || choice.mode == ToolChoice::Mode::kTool) && tools.empty())
    bad_value("tool_choice", fmt::format("\"{}\" needs 'tools'.", type));
  return choice;
}

// thinking: {"type": "enabled", "budget_tokens"} | {"type": "disabled"} | {"type": "adaptive"}.
bool parse_thinking(const Fields& f, const ApiRequest& r, bool count_tokens, int64_t& budget) {
  budget = 0;
  const Json* v = f.object("thinking");
  if (!v) return false;
  Fields t(*v, "thinking");
  const std::string type = block_type(t);
  if (type == "disabled") return false;
  if (type == "adaptive") return true;
  if (type != "enabled")
    bad_value("thinking.type", fmt::format("expected \"enabled\", \"disabled\" or \"adaptive\", got \"{}\".", type));
  if (!t.find("budget_tokens")) missing("thinking.budget_tokens");
  budget = *t.integer("budget_tokens", kMinThinkingBudget, int64_t{1} << 30);
  if (!count_tokens && budget >= r.max_tokens)
    bad_value("thinking.budget_tokens", fmt::format("must be less than max_tokens ({}), got {}.", r.max_tokens, budget));
  return true;
}

Json tool_use_input(const std::string& arguments) {
  Json input = Json::parse(arguments, nullptr, false);
  return input.is_object() ? input : Json::object();
}

}  // namespace

const FieldList& messages_request_fields() {
  static const FieldList fields = {"model", "stream", "max_tokens", "temperature", "top_p", "top_k", "metadata",
                                   "stop_sequences", "mcp_servers", "system", "messages", "tools", "tool_choice",
                                   "thinking"};
  return fields;
}

ApiRequest parse_messages_request(const Json& body, const RequestDefaults& d, const RequestLimits& limits,
                                  bool count_tokens) {
  ApiRequest r;
  r.kind = ApiKind::kMessages;
  Fields f(body, "", &messages_request_fields());
  if (!f.find("model")) missing("model");
  r.model = *f.string("model", limits.max_model_bytes);
  r.stream = f.boolean("stream").value_or(false);
  if (!count_tokens) {
    if (!f.find("max_tokens")) missing("max_tokens");
    r.max_tokens = *f.integer("max_tokens", 1, limits.max_tokens);
  }
  r.sampling = d.sampling;
  r.seed = d.seed;
  if (auto t = f.number("temperature", 0, 1)) r.sampling.temperature = static_cast<float>(*t);
  if (auto p = f.number("top_p", 0, 1, true)) r.sampling.top_p = static_cast<float>(*p);
  if (auto k = f.integer("top_k", 0, 1 << 30)) r.sampling.top_k = static_cast<int>(*k);
  if (const Json* meta = f.object("metadata")) Fields(*meta, "metadata").string("user_id");

  if (const Json* stop = f.array("stop_sequences")) {
    if (stop->size() > kMaxStopSequences)
      bad_value("stop_sequences", fmt::format("at most {} stop sequences are allowed.", kMaxStopSequences));
    for (size_t i = 0; i < stop->size(); ++i) {
      const std::string p = at_index("stop_sequences", i);
      if (!(*stop)[i].is_string()) wrong_type(p, "a string", (*stop)[i]);
      const std::string& s = (*stop)[i].get_ref<const std::string&>();
      if (s.empty()) bad_value(p, "stop sequences must not be empty.");
      if (s.size() > limits.max_stop_bytes)
        bad_value(p, fmt::format("a stop sequence may have at most {} bytes.", limits.max_stop_bytes));
      r.stop.push_back(s);
    }
  } else {
    r.stop = d.stop;
  }
  if (const Json* servers = f.array("mcp_servers"); servers && !servers->empty())
    unsupported("mcp_servers", "this server does not connect to MCP servers; pass their tools in 'tools'.");

  // The conversation.
  Json messages = Json::array();
  if (const Json* system = f.find("system")) messages.push_back({{"role", "system"}, {"content", parse_system(*system)}});
  const Json* list = f.array("messages");
  if (!list) missing("messages");
  if (list->empty()) bad_value("messages", "at least one message is required.");
  if (list->size() > limits.max_messages)
    bad_value("messages", fmt::format("at most {} messages are allowed, got {}.", limits.max_messages, list->size()));
  bool prefill = false;
  std::set<std::string> tool_use_ids;
  for (size_t i = 0; i < list->size(); ++i)
    convert_message((*list)[i], at_index("messages", i), i + 1 == list->size(), messages, prefill, tool_use_ids);

  std::set<std::string> tool_names;
  Json tools = parse_tools(f, limits, tool_names);
  r.tool_choice = parse_tool_choice(f, tool_names);
  const bool forced = r.tool_choice.mode == ToolChoice::Mode::kAny || r.tool_choice.mode == ToolChoice::Mode::kTool;
  const bool none = r.tool_choice.mode == ToolChoice::Mode::kNone;
  const bool thinking = parse_thinking(f, r, count_tokens, r.thinking_budget);
  if (forced && thinking)
    bad_value("tool_choice", "thinking may not be enabled when tool_choice forces tool use (use \"auto\" or \"none\").");
  if (forced && prefill)
    bad_value("tool_choice", "a prefilled assistant message cannot be combined with forced tool use.");
  if (forced) {
    // The answer is a tool-call block whose inputs follow the tools' input_schema (constrained
    // decoding); "tool" allows that tool alone, once.
    OutputConstraint& out = r.output;
    out.calls_required = true;
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& fn = tools[i]["function"];
      const std::string name = fn["name"].get<std::string>();
      if (r.tool_choice.mode == ToolChoice::Mode::kTool && name != r.tool_choice.name) continue;
      const bool strict = !(fn.contains("strict") && fn["strict"] == false);
      out.tools.push_back({name, fn["parameters"], fmt::format("tools[{}].input_schema", i), strict});
    }
    out.max_calls = r.tool_choice.mode == ToolChoice::Mode::kAny && r.tool_choice.parallel ? kMaxParallelToolCalls : 1;
    // A stop sequence could cut the input short: refused when given, dropped when a default.
    if (const Json* stop = f.find("stop_sequences"); stop && !stop->empty())
      unsupported("stop_sequences", "stop sequences cannot be combined with forced tool use (tool_choice \"any\" or \"tool\").");
    r.stop.clear();
  }

  chat::EncodeOptions eo;
  eo.thinking_mode = thinking ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  eo.drop_thinking = true;  // the official default (off by itself when tools are given)
  chat::Prompt p;
  try {
    p = chat::render_prompt(tools.empty() ? messages : chat::attach_tools(messages, tools), eo);
  } catch (const Error& e) {
    throw_bad_request("messages", "invalid_value", fmt::format("The conversation cannot be encoded: {}", e.what()));
  }
  set_chat_prompt(r, std::move(p));
  r.tools = !tools.empty() && !none;
  r.no_tool_calls = !tools.empty() && none;
  // A prefill closed the reasoning already (the encoder writes </think> before assistant text).
  r.thinking = thinking && !prefill;
  if (!r.thinking) r.thinking_budget = 0;
  return r;
}

// ---- errors ----------------------------------------------------------------------------------

std::string error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

Json error_json(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", error_type(e.status)}, {"message", e.message}}}};
}

std::string error_body(const ApiError& e) { return error_json(e).dump(-1, ' ', false, Json::error_handler_t::replace); }

// ---- responses -------------------------------------------------------------------------------

std::string stop_reason(FinishReason reason, const std::string& stop_string, bool tool_use) {
  if (tool_use) return "tool_use";
  switch (reason) {
    case FinishReason::kStop: return stop_string.empty() ? "end_turn" : "stop_sequence";
    case FinishReason::kLength:
    case FinishReason::kContextLimit: return "max_tokens";
    case FinishReason::kCancelled: return "end_turn";
  }
  return "end_turn";
}

Json usage_json(const GenerationStats& s) {
  return {{"input_tokens", s.prompt_tokens - s.reused_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", s.reused_tokens},
          {"output_tokens", s.generated_tokens}};
}

Json content_json(const ChatAnswer& a, bool thinking) {
  Json blocks = Json::array();
  if (thinking || !a.reasoning.empty()) blocks.push_back({{"type", "thinking"}, {"thinking", a.reasoning}, {"signature", ""}});
  if (!a.content.empty()) blocks.push_back({{"type", "text"}, {"text", a.content}});
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    const chat::ToolCall& c = a.tool_calls[i];
    const bool cut = a.cut_call && i + 1 == a.tool_calls.size();
    blocks.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name},
                      {"input", cut ? a.cut_input : tool_use_input(c.arguments)}});
  }
  if (blocks.empty()) blocks.push_back({{"type", "text"}, {"text", ""}});
  return blocks;
}

namespace {
Json stop_sequence_value(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }
}  // namespace

Json message_json(const ResponseHeader& h, const ChatAnswer& a, bool thinking, const std::string& reason,
                  const std::string& stop_string, Json usage) {
  return {{"id", h.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", h.model},
          {"content", content_json(a, thinking)},
          {"stop_reason", reason},
          {"stop_sequence", stop_sequence_value(reason == "stop_sequence" ? stop_string : "")},
          {"usage", std::move(usage)}};
}

std::string sse_event(const Json& event) {
  return "event: " + event.value("type", std::string("message")) + "\ndata: " +
         event.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

// ---- streaming -------------------------------------------------------------------------------

StreamEncoder::StreamEncoder(ResponseHeader header, bool thinking) : header_(std::move(header)), thinking_(thinking) {}

std::string StreamEncoder::start(const Json& usage) {
  Json message = {{"id", header_.id},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", header_.model},
                  {"content", Json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", usage}};
  return sse_event({{"type", "message_start"}, {"message", std::move(message)}}) + sse_event({{"type", "ping"}});
}

std::string StreamEncoder::open(Block kind) {
  Json block = kind == Block::kThinking ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                        : Json{{"type", "text"}, {"text", ""}};
  open_ = kind;
  return sse_event({{"type", "content_block_start"}, {"index", next_index_}, {"content_block", std::move(block)}});
}

std::string StreamEncoder::close() {
  if (open_ == Block::kNone) return "";
  if (open_ == Block::kThinking) thinking_done_ = true;
  open_ = Block::kNone;
  return sse_event({{"type", "content_block_stop"}, {"index", next_index_++}});
}

// With thinking on, the answer's first block is a thinking block, even an empty one (as
// content_json has it).
void StreamEncoder::ensure_thinking_block(std::string& out) {
  if (!thinking_ || thinking_done_ || open_ == Block::kThinking) return;
  out += open(Block::kThinking);
}

std::string StreamEncoder::delta(const ChatDelta& d) {
  std::string out;
  if (!d.reasoning.empty()) {
    if (open_ != Block::kThinking) {
      out += close();
      out += open(Block::kThinking);
    }
    out += sse_event({{"type", "content_block_delta"},
                      {"index", next_index_},
                      {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
  }
  if (!d.content.empty()) {
    if (open_ != Block::kText) {
      ensure_thinking_block(out);
      out += close();
      out += open(Block::kText);
    }
    out += sse_event({{"type", "content_block_delta"},
                      {"index", next_index_},
                      {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
  }
  if (!d.tool_calls.empty()) {
    ensure_thinking_block(out);
    out += close();
    for (size_t i = 0; i < d.tool_calls.size(); ++i) {
      const chat::ToolCall& c = d.tool_calls[i];
      // A cut call's input is its parameters so far, the same object the whole message has.
      const Json input = d.cut_call && i + 1 == d.tool_calls.size() ? d.cut_input : tool_use_input(c.arguments);
      out += sse_event({{"type", "content_block_start"},
                        {"index", next_index_},
                        {"content_block", {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", Json::object()}}}});
      out += sse_event({{"type", "content_block_delta"},
                        {"index", next_index_},
                        {"delta",
                         {{"type", "input_json_delta"},
                          {"partial_json", input.dump(-1, ' ', false, Json::error_handler_t::replace)}}}});
      out += sse_event({{"type", "content_block_stop"}, {"index", next_index_++}});
    }
  }
  return out;
}

std::string StreamEncoder::finish(const ChatDelta& rest, const std::string& reason, const std::string& stop_string,
                                  const Json& usage) {
  std::string out = delta(rest);
  ensure_thinking_block(out);
  out += close();
  if (next_index_ == 0) {  // nothing at all: one empty text block, as content_json gives
    out += open(Block::kText);
    out += close();
  }
  out += sse_event({{"type", "message_delta"},
                    {"delta", {{"stop_reason", reason}, {"stop_sequence", stop_sequence_value(reason == "stop_sequence" ? stop_string : "")}}},
                    {"usage", usage}});
  out += sse_event({{"type", "message_stop"}});
  return out;
}

std::string StreamEncoder::error(const ApiError& e) { return sse_event(error_json(e)); }

}  // namespace dsv4::server::anthropic
