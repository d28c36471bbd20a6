#include "dsv4/text/chat_format.h"

#include <algorithm>
#include <map>

#include "dsv4/text/dsml.h"
#include "dsv4/text/python_json.h"
#include "dsv4/util/error.h"

namespace dsv4::text::chat {
namespace {

// Fixed texts of the official encoder.
constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

constexpr std::string_view kResponseFormatIntro =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

const std::map<std::string, std::string, std::less<>>& task_tokens() {
  static const std::map<std::string, std::string, std::less<>> tokens = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"},   {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},   {"read_url", "<｜read_url｜>"},
  };
  return tokens;
}

// Python truthiness of a message field (absent, null, "", [], {} and false are all "no").
bool truthy(const Json& msg, const char* key) {
  auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return false;
  if (it->is_string()) return !it->get_ref<const std::string&>().empty();  // json::empty() is false for any string
  if (it->is_array() || it->is_object()) return !it->empty();
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number_integer()) return it->get<int64_t>() != 0;
  return true;
}

bool has(const Json& msg, const char* key) {
  auto it = msg.find(key);
  return it != msg.end() && !it->is_null();
}

std::string role_of(const Json& msg) {
  if (!msg.is_object()) fail("chat: every message must be a JSON object");
  auto it = msg.find("role");
  if (it == msg.end() || !it->is_string()) fail("chat: message without a string role");
  return it->get<std::string>();
}

// Message text: a string, null (= ""), or OpenAI content parts [{"type":"text","text":…}] joined.
std::string text_of(const Json& msg, const char* key) {
  auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string out;
    for (const auto& part : *it) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        fail("chat: {} parts other than {{\"type\": \"text\"}} are unsupported", key);
      out += part["text"].get<std::string>();
    }
    return out;
  }
  fail("chat: message {} must be a string", key);
}

std::string reasoning_of(const Json& msg) {
  return has(msg, "reasoning_content") ? text_of(msg, "reasoning_content") : text_of(msg, "reasoning");
}

// Tool messages become tool_result blocks of a user message; consecutive user/tool messages
// share one user turn (official merge_tool_messages).
Json merge_tool_messages(const Json& messages) {
  Json merged = Json::array();
  for (const Json& msg : messages) {
    const std::string role = role_of(msg);
    const auto joinable = [&] {
      return !merged.empty() && merged.back().value("role", "") == "user" && merged.back().contains("content_blocks");
    };
    if (role == "tool") {
      Json block = {{"type", "tool_result"},
                    {"tool_use_id", msg.contains("tool_call_id") && msg["tool_call_id"].is_string() ? msg["tool_call_id"] : Json("")},
                    {"content", text_of(msg, "content")}};
      if (joinable())
        merged.back()["content_blocks"].push_back(std::move(block));
      else
        merged.push_back({{"role", "user"}, {"content_blocks", Json::array({std::move(block)})}});
    } else if (role == "user") {
      Json block = {{"type", "text"}, {"text", text_of(msg, "content")}};
      if (joinable() && !has(merged.back(), "task")) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        Json user = {{"role", "user"}, {"content", text_of(msg, "content")}, {"content_blocks", Json::array({std::move(block)})}};
        for (const char* key : {"task", "wo_eos", "mask"})
          if (msg.contains(key)) user[key] = msg[key];
        merged.push_back(std::move(user));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

std::string call_id(const Json& call) {
  if (call.contains("id") && call["id"].is_string() && !call["id"].get<std::string>().empty()) return call["id"].get<std::string>();
  if (call.contains("function") && call["function"].is_object() && call["function"].contains("id") && call["function"]["id"].is_string())
    return call["function"]["id"].get<std::string>();
  return "";
}

// Tool results are put in the order of the calls of the latest assistant turn with tool calls
// (official sort_tool_results_by_call_order; results with unknown ids sort as position 0).
void sort_tool_results(Json& messages, std::map<std::string, size_t>& order) {
  for (Json& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "assistant" && truthy(msg, "tool_calls")) {
      order.clear();
      size_t i = 0;
      for (const auto& call : msg["tool_calls"]) {
        if (const std::string id = call_id(call); !id.empty()) order[id] = i;
        ++i;
      }
    } else if (role == "user" && truthy(msg, "content_blocks")) {
      Json& blocks = msg["content_blocks"];
      std::vector<Json> results;
      for (const auto& b : blocks)
        if (b.value("type", "") == "tool_result") results.push_back(b);
      if (results.size() <= 1 || order.empty()) continue;
      const auto rank = [&](const Json& b) {
        auto it = order.find(b.value("tool_use_id", ""));
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](const Json& a, const Json& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (auto& b : blocks)
        if (b.value("type", "") == "tool_result") b = results[next++];
    }
  }
}

Json preprocess(const Json& messages, std::map<std::string, size_t>& order) {
  Json merged = merge_tool_messages(messages);
  sort_tool_results(merged, order);
  return merged;
}

ptrdiff_t last_user_index(const Json& messages) {
  for (ptrdiff_t i = static_cast<ptrdiff_t>(messages.size()) - 1; i >= 0; --i) {
    const std::string role = role_of(messages[static_cast<size_t>(i)]);
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

// Before the last user/developer message: assistant turns lose their reasoning, developer (and
// any other non-kept) messages disappear (official _drop_thinking_messages).
Json drop_thinking_messages(const Json& messages) {
  const ptrdiff_t last_user = last_user_index(messages);
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& msg = messages[i];
    const std::string role = role_of(msg);
    const bool keep_role = role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
                           role == "direct_search_results";
    if (keep_role || static_cast<ptrdiff_t>(i) >= last_user) {
      out.push_back(msg);
    } else if (role == "assistant") {
      Json copy = msg;
      copy.erase("reasoning_content");
      copy.erase("reasoning");
      out.push_back(std::move(copy));
    }
  }
  return out;
}

Prompt render_user_blocks(const Json& blocks) {
  Prompt out;
  bool first = true;
  for (const auto& block : blocks) {
    if (!first) out.add_template("\n\n");
    first = false;
    const std::string type = block.value("type", "");
    if (type == "text") {
      out.add_caller(text_of(block, "text"));
    } else if (type == "tool_result") {
      out.add_template("<tool_result>");
      const Json& c = block.contains("content") ? block["content"] : Json("");
      if (c.is_array()) {
        bool first_part = true;
        for (const auto& part : c) {
          if (!first_part) out.add_template("\n\n");
          first_part = false;
          const std::string part_type = part.is_object() ? part.value("type", "") : "";
          if (part_type == "text") {
            out.add_caller(text_of(part, "text"));
          } else {
            out.add_template("[Unsupported ");
            out.add_caller(part_type);
            out.add_template("]");
          }
        }
      } else {
        out.add_caller(c.is_string() ? c.get<std::string>() : python_json_dumps(c));
      }
      out.add_template("</tool_result>");
    } else {
      out.add_template("[Unsupported ");
      out.add_caller(type);
      out.add_template("]");
    }
  }
  return out;
}

Prompt tools_and_format(const Json& msg) {
  Prompt out;
  if (truthy(msg, "tools")) {
    out.add_template("\n\n");
    out.add(render_tools(msg["tools"]));
  }
  if (truthy(msg, "response_format")) {
    out.add_template("\n\n" + std::string(kResponseFormatIntro));
    out.add_caller(python_json_dumps(msg["response_format"]));
  }
  return out;
}

Prompt render_message(size_t index, const Json& messages, const EncodeOptions& o, bool drop_thinking) {
  const Json& msg = messages[index];
  const std::string role = role_of(msg);
  const bool thinking = o.thinking_mode == ThinkingMode::kThinking;
  const ptrdiff_t last_user = last_user_index(messages);
  Prompt prompt;
  if (index == 0 && thinking && o.reasoning_effort == ReasoningEffort::kMax) prompt.add_template(kReasoningEffortMax);

  if (role == "system") {
    prompt.add_caller(text_of(msg, "content"));
    prompt.add(tools_and_format(msg));
  } else if (role == "developer") {
    if (!truthy(msg, "content")) fail("chat: a developer message needs content");
    prompt.add_template(kUser);
    prompt.add_caller(text_of(msg, "content"));
    prompt.add(tools_and_format(msg));
  } else if (role == "user") {
    prompt.add_template(kUser);
    if (truthy(msg, "content_blocks"))
      prompt.add(render_user_blocks(msg["content_blocks"]));
    else
      prompt.add_caller(text_of(msg, "content"));
  } else if (role == "latest_reminder") {
    if (!msg.contains("content") || !msg["content"].is_string()) fail("chat: a latest_reminder message needs string content");
    prompt.add_template(kLatestReminder);
    prompt.add_caller(msg["content"].get<std::string>());
  } else if (role == "assistant") {
    const bool previous_has_task = index > 0 && has(messages[index - 1], "task");
    if (thinking && !previous_has_task && (!drop_thinking || static_cast<ptrdiff_t>(index) > last_user)) {
      prompt.add_caller(reasoning_of(msg));
      prompt.add_template(kThinkEnd);
    }
    prompt.add_caller(text_of(msg, "content"));
    if (truthy(msg, "tool_calls")) prompt.add(dsml::render_tool_calls(msg["tool_calls"]));
    if (!truthy(msg, "wo_eos")) prompt.add_template(kEos);
  } else {
    fail("chat: unknown role {:?}", role);
  }

  // Transition: only when this is the last message or the next one is an assistant turn or a
  // latest_reminder.
  if (index + 1 < messages.size()) {
    const std::string next = role_of(messages[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return prompt;
  }
  if (has(msg, "task")) {
    const Json& task = msg["task"];
    auto it = task.is_string() ? task_tokens().find(task.get<std::string>()) : task_tokens().end();
    if (it == task_tokens().end()) fail("chat: invalid task {} (valid: action, query, authority, domain, title, read_url)", task.dump());
    if (it->first == "action") {
      prompt.add_template(kAssistant);
      prompt.add_template(thinking ? kThinkStart : kThinkEnd);
    }
    prompt.add_template(it->second);
  } else if (role == "user" || role == "developer") {
    prompt.add_template(kAssistant);
    const bool open_thinking = thinking && (!drop_thinking || static_cast<ptrdiff_t>(index) >= last_user);
    prompt.add_template(open_thinking ? kThinkStart : kThinkEnd);
  }
  return prompt;
}

}  // namespace

Prompt render_tools(const Json& tools) {
  if (!tools.is_array()) fail("chat: tools must be an array");
  const std::string dsml(kDsml);
  Prompt out;
  out.add_template("## Tools\n\n"
         "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
         "\"<" + dsml + "tool_calls>\" block like the following:\n\n"
         "<" + dsml + "tool_calls>\n"
         "<" + dsml + "invoke name=\"$TOOL_NAME\">\n"
         "<" + dsml + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + dsml + "parameter>\n"
         "...\n"
         "</" + dsml + "invoke>\n"
         "<" + dsml + "invoke name=\"$TOOL_NAME2\">\n"
         "...\n"
         "</" + dsml + "invoke>\n"
         "</" + dsml + "tool_calls>\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after </think> with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n");
  bool first = true;
  for (const auto& tool : tools) {
    if (!tool.is_object() || !tool.contains("function")) fail("chat: each tool needs a function object");
    if (!first) out.add_template("\n");
    first = false;
    out.add_caller(python_json_dumps(tool["function"]));
  }
  out.add_template("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n");
  return out;
}

namespace {

Json attach_to_system(const Json& messages, const char* key, const Json& value) {
  if (!messages.is_array()) fail("chat: messages must be an array");
  Json out = messages;
  if (value.is_null() || ((value.is_array() || value.is_object()) && value.empty())) return out;
  if (!out.empty() && role_of(out[0]) == "system") {
    out[0][key] = value;
  } else {
    out.insert(out.begin(), Json{{"role", "system"}, {"content", ""}, {key, value}});
  }
  return out;
}

}  // namespace

Json attach_tools(const Json& messages, const Json& tools) { return attach_to_system(messages, "tools", tools); }

Json attach_response_format(const Json& messages, const Json& format) {
  return attach_to_system(messages, "response_format", format);
}

void Prompt::add_caller(std::string_view s) {
  if (s.empty()) return;
  if (!caller.empty() && caller.back().end == text.size())
    caller.back().end += s.size();
  else
    caller.push_back({text.size(), text.size() + s.size()});
  text += s;
}

void Prompt::add(const Prompt& p) {
  const size_t base = text.size();
  for (const TextRange& r : p.caller) {
    if (!caller.empty() && caller.back().end == base + r.begin)
      caller.back().end = base + r.end;
    else
      caller.push_back({base + r.begin, base + r.end});
  }
  text += p.text;
}

size_t last_template_token(const Prompt& p, std::string_view token) {
  for (size_t at = p.text.rfind(token); at != std::string::npos; at = at ? p.text.rfind(token, at - 1) : std::string::npos) {
    const auto inside = [&](const TextRange& r) { return at < r.end && at + token.size() > r.begin; };
    if (std::none_of(p.caller.begin(), p.caller.end(), inside)) return at;
  }
  return std::string::npos;
}

IncrementalDecoder::ShowSpecial answer_specials(const Tokenizer& tokenizer, ThinkingMode mode, bool tools) {
  const TokenId think_end = mode == ThinkingMode::kThinking ? tokenizer.token_id(kThinkEnd).value_or(-1) : -1;
  const TokenId dsml = tools ? tokenizer.token_id(kDsml).value_or(-1) : -1;
  return [think_end, dsml, reasoning = true](TokenId id) mutable {
    if (id == think_end && reasoning) {
      reasoning = false;
      return true;
    }
    return id == dsml && id >= 0;
  };
}

std::string encode_messages(const Json& messages, const EncodeOptions& options, const Json& context) {
  return render_prompt(messages, options, context).text;
}

Prompt render_prompt(const Json& messages, const EncodeOptions& options, const Json& context) {
  if (!messages.is_array()) fail("chat: messages must be a JSON array");
  if (!context.is_array()) fail("chat: context must be a JSON array");
  // The tool-call order seen in the context steers how the new messages' results are sorted.
  std::map<std::string, size_t> order;
  const Json merged_context = preprocess(context, order);
  Json merged = preprocess(messages, order);

  Json full = merged_context;
  for (const auto& m : merged) full.push_back(m);

  Prompt prompt;
  if (options.add_bos && context.empty()) prompt.add_template(kBos);
  bool drop = options.drop_thinking;
  for (const auto& m : full)
    if (truthy(m, "tools")) drop = false;

  size_t context_len = merged_context.size();
  size_t count = merged.size();
  if (options.thinking_mode == ThinkingMode::kThinking && drop) {
    full = drop_thinking_messages(full);
    const size_t dropped_context = drop_thinking_messages(merged_context).size();
    if (dropped_context > full.size()) fail("chat: context does not fit the messages");
    count = full.size() - dropped_context;
    context_len = dropped_context;
  }
  for (size_t i = 0; i < count; ++i) prompt.add(render_message(context_len + i, full, options, drop));
  return prompt;
}

Json ParsedMessage::to_json() const {
  Json calls = Json::array();
  for (const auto& c : tool_calls)
    calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return {{"role", "assistant"}, {"content", content}, {"reasoning_content", reasoning_content}, {"tool_calls", calls}};
}

ParsedMessage parse_completion(std::string_view text, const ParseOptions& options) {
  ParsedMessage out;
  const std::string tool_start = dsml::tool_calls_start();
  size_t index = 0;
  if (options.thinking_mode == ThinkingMode::kThinking) {
    const size_t end = text.find(kThinkEnd);
    const size_t tools = text.find(tool_start);
    if (end == std::string_view::npos || (tools != std::string_view::npos && tools < end))
      fail("chat: invalid thinking format: missing {}", kThinkEnd);
    out.reasoning_content = std::string(text.substr(0, end));
    index = end + kThinkEnd.size();
  }
  const size_t eos = text.find(kEos, index);
  const size_t tools = text.find(tool_start, index);
  if (tools != std::string_view::npos && (eos == std::string_view::npos || tools < eos)) {
    out.content = std::string(text.substr(index, tools - index));
    size_t end = 0;
    out.tool_calls = dsml::parse_tool_calls(text, tools + tool_start.size(), end);
    const std::string_view rest = text.substr(end);
    if (!rest.empty() && rest != kEos) fail("chat: unexpected text after the tool calls: {:?}", std::string(rest.substr(0, 80)));
  } else if (eos != std::string_view::npos) {
    out.content = std::string(text.substr(index, eos - index));
    if (eos + kEos.size() != text.size())
      fail("chat: unexpected text after {}: {:?}", kEos, std::string(text.substr(eos + kEos.size(), 80)));
  } else {
    if (options.require_eos) fail("chat: invalid format: missing {}", kEos);
    out.content = std::string(text.substr(index));
  }
  for (std::string_view token : {kBos, kEos, kThinkStart, kThinkEnd, kDsml}) {
    if (out.content.find(token) != std::string::npos || out.reasoning_content.find(token) != std::string::npos)
      fail("chat: unexpected special token {} in the reasoning or content", token);
  }
  for (size_t i = 0; i < out.tool_calls.size(); ++i) out.tool_calls[i].id = options.tool_call_id_prefix + std::to_string(i);
  return out;
}

}  // namespace dsv4::text::chat
