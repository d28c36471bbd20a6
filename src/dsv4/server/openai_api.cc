#include "dsv4/server/openai_api.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "dsv4/text/utf8.h"
#include "dsv4/util/error.h"

namespace dsv4::server {

namespace {

namespace chat = text::chat;

constexpr int64_t kMaxTopLogprobs = 20;  // OpenAI's bound for chat (completions: 5; we allow 20)

// ---- JSON body guards ----------------------------------------------------------------------

// Deepest nesting of arrays/objects, counted outside strings; stops early past `limit`.
size_t nesting_depth(std::string_view s, size_t limit) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Records where the parser gave up, to tell the client (the DOM parser only says "failed").
class ErrorPositionSax : public nlohmann::json_sax<Json> {
 public:
  size_t position = 0;
  std::string token;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string& last_token, const nlohmann::detail::exception&) override {
    position = pos;
    token = last_token;
    return false;
  }
};

// ---- fields both endpoints share -----------------------------------------------------------

void parse_common(const Fields& f, const RequestDefaults& d, const RequestLimits& limits, ApiRequest& r) {
  if (!f.find("model")) missing("model");
  r.model = *f.string("model", limits.max_model_bytes);
  r.stream = f.boolean("stream").value_or(false);
  if (const Json* so = f.object("stream_options")) {
    if (!r.stream) bad_value("stream_options", "only allowed when 'stream' is true.");
    r.include_usage = Fields(*so, "stream_options").boolean("include_usage").value_or(false);
  }
  r.sampling = d.sampling;
  if (auto t = f.number("temperature", 0, 2)) r.sampling.temperature = static_cast<float>(*t);
  if (auto p = f.number("top_p", 0, 1, true)) r.sampling.top_p = static_cast<float>(*p);
  if (auto k = f.integer("top_k", 0, 1 << 30)) r.sampling.top_k = static_cast<int>(*k);
  if (auto m = f.number("min_p", 0, 1)) r.sampling.min_p = static_cast<float>(*m);
  if (auto rp = f.number("repetition_penalty", 0, 100, true)) r.sampling.repetition_penalty = static_cast<float>(*rp);
  if (auto v = f.number("frequency_penalty", -2, 2)) r.sampling.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2, 2)) r.sampling.presence_penalty = static_cast<float>(*v);
  if (auto n = f.integer("n", 1, static_cast<int64_t>(limits.max_choices))) r.n = static_cast<int>(*n);
  if (auto s = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    r.seed = static_cast<uint64_t>(*s);
  else
    r.seed = d.seed;
  r.max_tokens = d.max_tokens;
  if (auto m = f.integer("max_tokens", 1, limits.max_tokens)) r.max_tokens = *m;
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  r.spec = d.spec;
  if (auto s = f.string("spec", 16)) {
    if (*s == "off") r.spec = SpecMode::kOff;
    else if (*s == "auto") r.spec = SpecMode::kAuto;
    else if (*s == "ngram") r.spec = SpecMode::kNgram;
    else if (*s == "mtp" && d.mtp_loaded) r.spec = SpecMode::kMtp;
    else if (*s == "mtp")
      bad_value("spec", "\"mtp\" needs the server started with --spec mtp (or auto, when the MTP layer fits) on a "
                        "checkpoint with an MTP layer.");
    else bad_value("spec", "must be \"off\", \"auto\", \"ngram\" or \"mtp\".");
  }
  r.draft_max = d.draft_max;
  if (auto k = f.integer("draft_max", 1, kMaxDraftTokens)) r.draft_max = static_cast<int>(*k);

  if (!f.find("stop")) r.stop = d.stop;
  if (const Json* stop = f.find("stop")) {
    auto add = [&](const Json& v, const std::string& param) {
      if (!v.is_string()) wrong_type(param, "a string", v);
      const std::string& s = v.get_ref<const std::string&>();
      if (s.empty()) bad_value(param, "stop strings must not be empty.");
      if (s.size() > limits.max_stop_bytes)
        bad_value(param, fmt::format("a stop string may have at most {} bytes.", limits.max_stop_bytes));
      r.stop.push_back(s);
    };
    if (stop->is_string()) {
      add(*stop, "stop");
    } else if (stop->is_array()) {
      if (stop->size() > limits.max_stop) bad_value("stop", fmt::format("at most {} stop strings are allowed.", limits.max_stop));
      for (size_t i = 0; i < stop->size(); ++i) add((*stop)[i], at_index("stop", i));
    } else {
      wrong_type("stop", "a string or an array of strings", *stop);
    }
  }
}

// ---- chat ----------------------------------------------------------------------------------

// Content: a string, or text parts [{"type": "text", "text": "..."}]. Returns it normalized.
Json parse_content(const Json& v, const std::string& param) {
  if (v.is_string()) return v;
  if (!v.is_array()) wrong_type(param, "a string or an array of content parts", v);
  Json parts = Json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = at_index(param, i);
    if (!v[i].is_object()) wrong_type(p, "an object", v[i]);
    Fields part(v[i], p);
    const std::string type = part.string("type").value_or("");
    if (!part.find("type")) missing(part.name("type"));
    if (type != "text")
      unsupported(part.name("type"), fmt::format("only \"text\" content parts are supported, got \"{}\".", type));
    if (!part.find("text")) missing(part.name("text"));
    parts.push_back({{"type", "text"}, {"text", *part.string("text")}});
  }
  return parts;
}

bool content_is_empty(const Json& c) {
  if (c.is_string()) return c.get_ref<const std::string&>().empty();
  for (const auto& part : c)
    if (!part["text"].get_ref<const std::string&>().empty()) return false;
  return true;
}

Json parse_tool_calls(const Json& v, const std::string& param) {
  if (!v.is_array()) wrong_type(param, "an array", v);
  Json calls = Json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = at_index(param, i);
    if (!v[i].is_object()) wrong_type(p, "an object", v[i]);
    Fields call(v[i], p);
    if (auto type = call.string("type"); type && *type != "function")
      unsupported(call.name("type"), fmt::format("only \"function\" tool calls are supported, got \"{}\".", *type));
    const std::string id = call.string("id", 256).value_or("");
    const Json* fn = call.object("function");
    if (!fn) missing(call.name("function"));
    Fields function(*fn, call.name("function"));
    if (!function.find("name")) missing(function.name("name"));
    const std::string name = *function.string("name", 64);
    if (!valid_function_name(name))
      bad_value(function.name("name"), "a function name is 1 to 64 letters, digits, '_' or '-'.");
    std::string arguments = function.string("arguments").value_or("{}");
    Json parsed = Json::parse(arguments, nullptr, false);
    if (!parsed.is_object())
      bad_value(function.name("arguments"), "must be a JSON object encoded as a string.");
    Json out = {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
    calls.push_back(std::move(out));
  }
  return calls;
}

Json parse_messages(const Fields& f, const RequestLimits& limits) {
  const Json* messages = f.array("messages");
  if (!messages) missing("messages");
  if (messages->empty()) bad_value("messages", "at least one message is required.");
  if (messages->size() > limits.max_messages)
    bad_value("messages", fmt::format("at most {} messages are allowed, got {}.", limits.max_messages, messages->size()));
  Json out = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string p = at_index("messages", i);
    const Json& m = (*messages)[i];
    if (!m.is_object()) wrong_type(p, "an object", m);
    Fields msg(m, p);
    if (!msg.find("role")) missing(msg.name("role"));
    const std::string role = *msg.string("role");
    Json clean = {{"role", role}};
    const Json* content = msg.find("content");
    if (role == "system" || role == "developer" || role == "user" || role == "tool") {
      if (!content) missing(msg.name("content"));
      clean["content"] = parse_content(*content, msg.name("content"));
      if (role == "developer" && content_is_empty(clean["content"]))
        bad_value(msg.name("content"), "a developer message needs content.");
      if (role == "tool") {
        if (!msg.find("tool_call_id")) missing(msg.name("tool_call_id"));
        clean["tool_call_id"] = *msg.string("tool_call_id", 256);
      }
    } else if (role == "assistant") {
      clean["content"] = content ? parse_content(*content, msg.name("content")) : Json("");
      // Earlier answers' reasoning, as clients send it back (vLLM's newer name: "reasoning"); the
      // encoder shows or drops it as the official encoding says (spec §5.2).
      if (auto reasoning = msg.string("reasoning_content")) clean["reasoning_content"] = *reasoning;
      else if (auto alias = msg.string("reasoning")) clean["reasoning_content"] = *alias;
      if (const Json* calls = msg.find("tool_calls")) clean["tool_calls"] = parse_tool_calls(*calls, msg.name("tool_calls"));
    } else {
      bad_value(msg.name("role"),
                fmt::format("unknown role \"{}\" (expected system, developer, user, assistant or tool).", role));
    }
    msg.string("name", 256);  // accepted (type-checked) and not used: the format has no names
    out.push_back(std::move(clean));
  }
  return out;
}

Json parse_tools(const Fields& f, const RequestLimits& limits) {
  const Json* tools = f.array("tools");
  if (!tools || tools->empty()) return Json::array();
  if (tools->size() > limits.max_tools) bad_value("tools", fmt::format("at most {} tools are allowed.", limits.max_tools));
  Json out = Json::array();
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string p = at_index("tools", i);
    if (!(*tools)[i].is_object()) wrong_type(p, "an object", (*tools)[i]);
    Fields tool((*tools)[i], p);
    if (!tool.find("type")) missing(tool.name("type"));
    if (*tool.string("type") != "function")
      unsupported(tool.name("type"), "only \"function\" tools are supported.");
    const Json* fn = tool.object("function");
    if (!fn) missing(tool.name("function"));
    Fields function(*fn, tool.name("function"));
    if (!function.find("name")) missing(function.name("name"));
    const std::string name = *function.string("name");
    if (!valid_function_name(name))
      bad_value(function.name("name"), "a function name is 1 to 64 letters, digits, '_' or '-'.");
    // As the Anthropic API: a call names its function, so two functions may not share a name.
    if (!names.insert(name).second)
      bad_value(function.name("name"), fmt::format("function names must be unique; \"{}\" is given twice.", name));
    function.string("description");
    function.object("parameters");
    function.boolean("strict");
    // Keep the schema's own key order: the model sees it as written.
    Json clean = Json::object();
    for (const auto& [key, value] : fn->items())
      if ((key == "name" || key == "description" || key == "parameters" || key == "strict") && !value.is_null())
        clean[key] = value;
    out.push_back({{"type", "function"}, {"function", std::move(clean)}});
  }
  return out;
}

// The thinking switch and effort from whichever of the accepted spellings the request uses.
void parse_thinking(const Fields& f, bool& thinking, chat::ReasoningEffort& effort) {
  thinking = false;
  effort = chat::ReasoningEffort::kDefault;
  if (auto e = f.string("reasoning_effort")) {
    if (*e == "none" || *e == "minimal") {
      thinking = false;
    } else if (*e == "low" || *e == "medium") {
      thinking = true;
    } else if (*e == "high") {
      thinking = true;
      effort = chat::ReasoningEffort::kHigh;
    } else if (*e == "max" || *e == "xhigh") {
      thinking = true;
      effort = chat::ReasoningEffort::kMax;
    } else {
      bad_value("reasoning_effort", fmt::format("expected none, minimal, low, medium, high, max or xhigh, got \"{}\".", *e));
    }
  }
  if (const Json* t = f.find("thinking")) {
    if (t->is_boolean()) {
      thinking = t->get<bool>();
    } else if (t->is_object()) {
      Fields tf(*t, "thinking");
      const std::string type = tf.string("type").value_or("");
      if (type != "enabled" && type != "disabled")
        bad_value("thinking.type", fmt::format("expected \"enabled\" or \"disabled\", got \"{}\".", type));
      thinking = type == "enabled";
    } else {
      wrong_type("thinking", "a boolean or an object", *t);
    }
  }
  if (const Json* kw = f.object("chat_template_kwargs")) {
    Fields k(*kw, "chat_template_kwargs");
    if (auto t = k.boolean("enable_thinking")) thinking = *t;
    if (auto t = k.boolean("thinking")) thinking = *t;
  }
  if (!thinking) effort = chat::ReasoningEffort::kDefault;
}

}  // namespace

// ---- body -----------------------------------------------------------------------------------

const FieldList& chat_request_fields() {
  static const FieldList fields = {
      "model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
      "frequency_penalty", "presence_penalty", "n", "seed", "max_tokens", "ignore_eos", "spec", "draft_max", "stop",
      "max_completion_tokens", "logprobs", "top_logprobs", "parallel_tool_calls", "response_format", "messages",
      "tools", "tool_choice", "reasoning_effort", "thinking", "chat_template_kwargs"};
  return fields;
}

const FieldList& completion_request_fields() {
  static const FieldList fields = {
      "model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
      "frequency_penalty", "presence_penalty", "n", "seed", "max_tokens", "ignore_eos", "spec", "draft_max", "stop", "echo", "suffix",
      "best_of", "logprobs", "prompt", "special_tokens"};
  return fields;
}

void set_chat_prompt(ApiRequest& r, chat::Prompt p) {
  // The last user/tool turn starts with the format's <｜User｜>, an added token, so the text
  // before it tokenizes to a prefix of the prompt's tokens (a user's "<｜User｜>" is plain text).
  if (size_t at = chat::last_template_token(p, chat::kUser); at != std::string::npos && at > 0) r.history_bytes = at;
  r.prompt_text = std::move(p.text);
  r.prompt_caller = std::move(p.caller);
}

Json parse_json_body(std::string_view body, const RequestLimits& limits, const FieldList* fields) {
  if (body.empty()) throw_bad_request("", "invalid_json", "The request body is empty; expected a JSON object.");
  if (size_t ok = text::valid_utf8_prefix(body); ok != body.size())
    throw_bad_request("", "invalid_utf8", fmt::format("The request body is not valid UTF-8 (byte offset {}).", ok));
  if (size_t depth = nesting_depth(body, limits.max_depth); depth > limits.max_depth)
    throw_bad_request("", "invalid_json", fmt::format("The JSON body is nested deeper than {} levels.", limits.max_depth));
  // The callback sees every event; members of the top-level object that the endpoint does not
  // read are refused at their key, and the DOM parser then drops their values as it goes.
  size_t kept = 0;
  bool keep_member = true;
  auto filter = [&](int depth, Json::parse_event_t event, Json& parsed) {
    using Event = Json::parse_event_t;
    if (event == Event::key && depth == 1) {
      keep_member = !fields || std::find(fields->begin(), fields->end(), parsed.get_ref<const std::string&>()) != fields->end();
      return keep_member;
    }
    if (depth >= 1 && keep_member && (event == Event::value || event == Event::object_start || event == Event::array_start) &&
        ++kept > limits.max_json_values)
      throw_bad_request("", "invalid_json",
                        fmt::format("The JSON body has more than {} values in the fields this endpoint reads.",
                                    limits.max_json_values));
    return true;
  };
  Json j = Json::parse(body, Json::parser_callback_t(filter), false);
  if (j.is_discarded()) {
    ErrorPositionSax sax;
    Json::sax_parse(body, &sax);
    throw_bad_request("", "invalid_json",
                      fmt::format("The body is not valid JSON (syntax error at byte {}).", sax.position));
  }
  if (!j.is_object()) throw_bad_request("", "invalid_json", fmt::format("The body must be a JSON object, got {}.", type_name(j)));
  return j;
}

// ---- requests -------------------------------------------------------------------------------

ApiRequest parse_chat_request(const Json& body, const RequestDefaults& d, const RequestLimits& limits) {
  ApiRequest r;
  r.kind = ApiKind::kChat;
  Fields f(body, "", &chat_request_fields());
  parse_common(f, d, limits, r);
  if (auto m = f.integer("max_completion_tokens", 1, limits.max_tokens)) r.max_tokens = *m;
  const bool logprobs = f.boolean("logprobs").value_or(false);
  const auto top_logprobs = f.integer("top_logprobs", 0, kMaxTopLogprobs);
  if (top_logprobs && !logprobs) bad_value("top_logprobs", "requires 'logprobs' to be true.");
  if (logprobs) r.top_logprobs = static_cast<int>(top_logprobs.value_or(0));
  const bool parallel = f.boolean("parallel_tool_calls").value_or(true);
  OutputConstraint& out = r.output;
  if (const Json* rf = f.object("response_format")) {
    Fields rff(*rf, "response_format");
    if (!rff.find("type")) missing("response_format.type");
    const std::string type = *rff.string("type");
    if (type == "json_object") {
      out.content_schema = Json{{"type", "object"}};
      out.content_param = "response_format";
    } else if (type == "json_schema") {
      const Json* js = rff.object("json_schema");
      if (!js) missing("response_format.json_schema");
      Fields jf(*js, "response_format.json_schema");
      if (!jf.find("name")) missing(jf.name("name"));
      if (!valid_function_name(*jf.string("name")))
        bad_value(jf.name("name"), "a response format name is 1 to 64 letters, digits, '_' or '-'.");
      jf.string("description");
      out.content_strict = jf.boolean("strict").value_or(true);
      const Json* schema = jf.find("schema");
      if (schema && !schema->is_object() && !schema->is_boolean()) wrong_type(jf.name("schema"), "an object", *schema);
      out.content_schema = schema ? *schema : Json{{"type", "object"}};
      out.content_param = jf.name("schema");
    } else if (type != "text") {
      bad_value("response_format.type", fmt::format("expected \"text\", \"json_object\" or \"json_schema\", got \"{}\".", type));
    }
  }

  Json messages = parse_messages(f, limits);
  Json tools = parse_tools(f, limits);
  bool use_tools = !tools.empty();
  std::string forced;  // a named function the answer must call
  if (const Json* choice = f.find("tool_choice")) {
    if (choice->is_string()) {
      const std::string& c = choice->get_ref<const std::string&>();
      if (c == "none") {
        use_tools = false;
      } else if (c == "required") {
        if (tools.empty()) bad_value("tool_choice", "\"required\" needs at least one tool in 'tools'.");
        out.calls_required = true;
      } else if (c != "auto") {
        bad_value("tool_choice", fmt::format("expected \"none\", \"auto\" or \"required\", got \"{}\".", c));
      }
    } else if (choice->is_object()) {
      Fields cf(*choice, "tool_choice");
      if (!cf.find("type")) missing("tool_choice.type");
      if (*cf.string("type") != "function") bad_value("tool_choice.type", "only \"function\" can be chosen.");
      const Json* fn = cf.object("function");
      if (!fn) missing("tool_choice.function");
      Fields ff(*fn, "tool_choice.function");
      if (!ff.find("name")) missing("tool_choice.function.name");
      forced = *ff.string("name");
      bool found = false;
      for (const Json& t : tools) found = found || t["function"]["name"] == forced;
      if (!found) bad_value("tool_choice.function.name", fmt::format("no tool in 'tools' is named \"{}\".", forced));
      out.calls_required = true;
    } else {
      wrong_type("tool_choice", "a string or an object", *choice);
    }
  }
  if (out.calls_required || (out.content_schema && use_tools)) {
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& fn = tools[i]["function"];
      const std::string name = fn["name"].get<std::string>();
      if (!forced.empty() && name != forced) continue;
      OutputConstraint::Tool t{name, std::nullopt, fmt::format("tools[{}].function.parameters", i)};
      if (fn.contains("parameters")) t.parameters = fn["parameters"];
      t.strict = !(fn.contains("strict") && fn["strict"] == false);
      out.tools.push_back(std::move(t));
    }
    out.max_calls = forced.empty() && parallel ? kMaxParallelToolCalls : 1;
  }
  if (out.active()) {
    // A stop string could cut the value short: refused when given, dropped when a default.
    if (const Json* stop = f.find("stop"); stop && !(stop->is_array() && stop->empty()))
      unsupported("stop", "stop sequences cannot be combined with a JSON response format or a required tool call.");
    r.stop.clear();
  }

  chat::EncodeOptions eo;
  parse_thinking(f, r.thinking, eo.reasoning_effort);
  eo.thinking_mode = r.thinking ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  // The official default: earlier turns' reasoning is not shown to the model again.
  eo.drop_thinking = true;
  r.tools = use_tools;
  if (out.content_schema) messages = chat::attach_response_format(messages, *out.content_schema);
  chat::Prompt p;
  try {
    p = chat::render_prompt(use_tools ? chat::attach_tools(messages, tools) : messages, eo);
  } catch (const Error& e) {
    throw_bad_request("messages", "invalid_value", fmt::format("The conversation cannot be encoded: {}", e.what()));
  }
  set_chat_prompt(r, std::move(p));
  return r;
}

ApiRequest parse_completion_request(const Json& body, const RequestDefaults& d, const RequestLimits& limits) {
  ApiRequest r;
  r.kind = ApiKind::kCompletion;
  Fields f(body, "", &completion_request_fields());
  parse_common(f, d, limits, r);
  if (f.boolean("echo").value_or(false)) unsupported("echo", "echoing the prompt is not supported.");
  if (auto s = f.string("suffix"); s && !s->empty()) unsupported("suffix", "insertion (suffix) is not supported.");
  if (auto b = f.integer("best_of", 1, std::numeric_limits<int64_t>::max()); b && *b != 1)
    unsupported("best_of", "only best_of = 1 is supported.");
  if (auto l = f.integer("logprobs", 0, kMaxTopLogprobs)) r.top_logprobs = static_cast<int>(*l);

  const Json& prompt = f.require("prompt");
  auto token_ids = [&](const Json& ids, const std::string& param) {
    if (ids.empty()) bad_value(param, "the prompt has no tokens.");
    for (size_t i = 0; i < ids.size(); ++i) {
      const Json& id = ids[i];
      if (!id.is_number_integer()) wrong_type(at_index(param, i), "an integer token id", id);
      if (id.is_number_unsigned() ? id.get<uint64_t>() >= static_cast<uint64_t>(d.vocab_size)
                                  : (id.get<int64_t>() < 0 || id.get<int64_t>() >= d.vocab_size))
        bad_value(at_index(param, i), fmt::format("token ids must be in [0, {}).", d.vocab_size));
      r.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  };
  r.special_tokens = f.boolean("special_tokens").value_or(false);
  const auto set_text = [&](const Json& text) {
    r.prompt_text = std::string(chat::kBos) + text.get<std::string>();
    if (!r.special_tokens && r.prompt_text.size() > chat::kBos.size())
      r.prompt_caller = {{chat::kBos.size(), r.prompt_text.size()}};
  };
  if (prompt.is_string()) {
    set_text(prompt);
  } else if (prompt.is_array()) {
    if (prompt.empty()) bad_value("prompt", "the prompt is empty.");
    if (prompt[0].is_number_integer()) {
      token_ids(prompt, "prompt");
    } else {
      if (prompt.size() != 1) unsupported("prompt", "one prompt per request is supported.");
      if (prompt[0].is_string()) set_text(prompt[0]);
      else if (prompt[0].is_array()) token_ids(prompt[0], "prompt[0]");
      else wrong_type("prompt[0]", "a string or an array of token ids", prompt[0]);
    }
  } else {
    wrong_type("prompt", "a string or an array of token ids", prompt);
  }
  return r;
}

constrain::AnswerFormat answer_format(const OutputConstraint& c, bool thinking) {
  constrain::AnswerFormat f;
  f.thinking = thinking;
  if (c.content_schema) {
    f.content_schema = &*c.content_schema;
    f.content_where = c.content_param;
    f.content_strict = c.content_strict;
  }
  for (const OutputConstraint::Tool& t : c.tools)
    f.tools.push_back({t.name, t.parameters ? &*t.parameters : nullptr, t.param, t.strict});
  f.calls_required = c.calls_required;
  f.max_calls = c.max_calls;
  return f;
}

// ---- responses ------------------------------------------------------------------------------

std::string finish_reason_text(FinishReason reason, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength:
    case FinishReason::kContextLimit: return "length";
    case FinishReason::kCancelled: return "stop";
  }
  return "stop";
}

Json usage_json(const GenerationStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.generated_tokens},
          {"total_tokens", s.prompt_tokens + s.generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.reused_tokens}}}};
}

Json stats_json(const GenerationStats& s, double queue_s) {
  return {{"queue_s", queue_s},
          {"ttft_s", s.ttft_s},
          {"prefill_tok_s", s.prefill_tok_s()},
          {"decode_tok_s", s.decode_tok_s()},
          {"reused_tokens", s.reused_tokens},
          {"expert_hit_rate", s.hit_rate()},
          {"bytes_read", s.bytes_read},
          {"drafted_tokens", s.drafted_tokens},
          {"accepted_tokens", s.accepted_tokens},
          {"tokens_per_pass", s.tokens_per_pass()}};
}

Json tool_calls_json(const std::vector<text::chat::ToolCall>& calls, bool with_index) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json c = Json::object();
    if (with_index) c["index"] = i;
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

namespace {
Json finish_value(const std::string& finish) { return finish.empty() ? Json(nullptr) : Json(finish); }
}  // namespace

GenerationStats choices_usage(std::span<const GenerationStats* const> choices) {
  GenerationStats usage = *choices.front();
  for (const GenerationStats* s : choices.subspan(1)) usage.generated_tokens += s->generated_tokens;
  return usage;
}

Json chat_choice_json(size_t index, const ChatAnswer& a, bool thinking, const std::string& finish, Json logprobs) {
  Json message = {{"role", "assistant"}};
  message["content"] = a.content.empty() && !a.tool_calls.empty() ? Json(nullptr) : Json(a.content);
  if (thinking || !a.reasoning.empty()) message["reasoning_content"] = a.reasoning;
  if (!a.tool_calls.empty()) message["tool_calls"] = tool_calls_json(a.tool_calls, false);
  return {{"index", index}, {"message", std::move(message)}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
}

Json chat_completion_json(const ResponseHeader& h, Json choices, Json usage, Json stats) {
  return {{"id", h.id},
          {"object", "chat.completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", std::move(choices)},
          {"usage", std::move(usage)},
          {"stats", std::move(stats)}};
}

Json chat_chunk_json(const ResponseHeader& h, Json delta, const std::string& finish, Json logprobs, size_t index) {
  return {{"id", h.id},
          {"object", "chat.completion.chunk"},
          {"created", h.created},
          {"model", h.model},
          {"choices", Json::array({{{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                                    {"finish_reason", finish_value(finish)}}})}};
}

Json completion_choice_json(size_t index, const std::string& text, const std::string& finish, Json logprobs) {
  return {{"index", index}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
}

Json completion_json(const ResponseHeader& h, Json choices, Json usage, Json stats) {
  return {{"id", h.id},
          {"object", "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", std::move(choices)},
          {"usage", std::move(usage)},
          {"stats", std::move(stats)}};
}

Json completion_chunk_json(const ResponseHeader& h, const std::string& text, const std::string& finish, Json logprobs,
                           size_t index) {
  return {{"id", h.id},
          {"object", "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", Json::array({{{"index", index}, {"text", text}, {"logprobs", std::move(logprobs)},
                                    {"finish_reason", finish_value(finish)}}})}};
}

Json usage_chunk_json(ApiKind kind, const ResponseHeader& h, Json usage, Json stats) {
  return {{"id", h.id},
          {"object", kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", Json::array()},
          {"usage", std::move(usage)},
          {"stats", std::move(stats)}};
}

std::string logprob_token_text(const text::Tokenizer& tokenizer, int32_t id) {
  const std::string bytes = tokenizer.token_bytes(id);
  if (text::valid_utf8_prefix(bytes) == bytes.size()) return bytes;
  std::string out = "bytes:";
  for (unsigned char c : bytes) out += fmt::format("\\x{:02x}", c);
  return out;
}

namespace {
Json token_bytes_json(const text::Tokenizer& tokenizer, int32_t id) {
  Json out = Json::array();
  for (unsigned char c : tokenizer.token_bytes(id)) out.push_back(static_cast<int>(c));
  return out;
}
}  // namespace

Json chat_logprobs_json(std::span<const TokenLogprob> logprobs, const text::Tokenizer& tokenizer) {
  Json content = Json::array();
  for (const TokenLogprob& lp : logprobs) {
    Json top = Json::array();
    for (const auto& [id, logprob] : lp.top)
      top.push_back({{"token", logprob_token_text(tokenizer, id)}, {"logprob", logprob}, {"bytes", token_bytes_json(tokenizer, id)}});
    content.push_back({{"token", logprob_token_text(tokenizer, lp.token)},
                       {"logprob", lp.logprob},
                       {"bytes", token_bytes_json(tokenizer, lp.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

Json completion_logprobs_json(std::span<const TokenLogprob> logprobs, const text::Tokenizer& tokenizer, size_t offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  for (const TokenLogprob& lp : logprobs) {
    tokens.push_back(logprob_token_text(tokenizer, lp.token));
    token_logprobs.push_back(lp.logprob);
    Json alternatives = Json::object();
    for (const auto& [id, logprob] : lp.top) alternatives[logprob_token_text(tokenizer, id)] = logprob;
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += tokenizer.token_bytes(lp.token).size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

std::string sse_event(const Json& j) {
  // Generated text can hold invalid UTF-8 only as U+FFFD (the decoder repairs it), but be safe.
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

}  // namespace dsv4::server
