#include "dsv4/text/dsml.h"

#include <optional>

#include "dsv4/text/python_json.h"
#include "dsv4/util/error.h"

namespace dsv4::text::dsml {
namespace {

using chat::Json;

const std::string kDsml(chat::kDsml);
const std::string kInvokeOpen = "<" + kDsml + "invoke";
const std::string kInvokeClose = "</" + kDsml + "invoke";
const std::string kParamOpen = "<" + kDsml + "parameter";
const std::string kParamClose = "/" + kDsml + "parameter";
const std::string kBlockClose = "</" + kDsml + "tool_calls>";

// Key names and values are the caller's text; the markup around them is the format's.
chat::Prompt render_arguments(const Json& arguments) {
  // The official encoder parses the arguments text; text that is not JSON becomes one string
  // parameter named "arguments". An already-parsed object (some clients send one) is used as is.
  Json parsed;
  if (arguments.is_string()) {
    try {
      parsed = Json::parse(arguments.get_ref<const std::string&>());
    } catch (const Json::exception&) {
      parsed = Json{{"arguments", arguments}};
    }
  } else {
    parsed = arguments;
  }
  if (!parsed.is_object()) fail("tool call arguments must be a JSON object, got {}", python_json_dumps(parsed));
  chat::Prompt out;
  bool first = true;
  for (const auto& [key, value] : parsed.items()) {
    if (!first) out.add_template("\n");
    first = false;
    const bool is_string = value.is_string();
    out.add_template("<" + kDsml + "parameter name=\"");
    out.add_caller(key);
    out.add_template(std::string("\" string=\"") + (is_string ? "true" : "false") + "\">");
    out.add_caller(is_string ? value.get<std::string>() : python_json_dumps(value));
    out.add_template("</" + kDsml + "parameter>");
  }
  return out;
}

struct Stop {
  size_t content_end;  // where the text before the stop ends
  size_t after;        // index after the stop string
  int which;           // index into the stop list, -1 = none found (content runs to the end)
};

// The earliest of `stops` at or after `from` (the official _read_until_stop).
Stop read_until(std::string_view text, size_t from, std::initializer_list<std::string_view> stops) {
  Stop best{text.size(), text.size(), -1};
  int i = 0;
  for (std::string_view s : stops) {
    const size_t pos = text.find(s, from);
    if (pos != std::string_view::npos && pos < best.content_end) best = {pos, pos + s.size(), i};
    ++i;
  }
  return best;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's `$` also matches just before a final "\n": the official patterns accept one extra
// trailing newline (which is what a call without parameters ends with).
std::optional<std::string_view> strip_suffix_py_dollar(std::string_view s, std::string_view suffix) {
  if (s.size() >= suffix.size() + 1 && s.back() == '\n' && s.substr(s.size() - 1 - suffix.size(), suffix.size()) == suffix)
    return s.substr(0, s.size() - 1 - suffix.size());
  if (s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix) return s.substr(0, s.size() - suffix.size());
  return std::nullopt;
}

// ^\s*name="(.*?)">\n$
std::string parse_invoke_name(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  const std::string_view rest = s.substr(i);
  constexpr std::string_view kPrefix = "name=\"";
  if (rest.substr(0, kPrefix.size()) == kPrefix) {
    if (auto name = strip_suffix_py_dollar(rest.substr(kPrefix.size()), "\">\n")) return std::string(*name);
  }
  fail("tool call: malformed invoke name {:?}", std::string(s));
}

struct Parameter {
  std::string name;
  bool is_string;
  std::string value;
};

// ^ name="(.*?)" string="(true|false)">(.*?)<$
Parameter parse_parameter(std::string_view s) {
  constexpr std::string_view kPrefix = " name=\"";
  if (s.substr(0, kPrefix.size()) == kPrefix) {
    const std::string_view rest = s.substr(kPrefix.size());
    for (size_t k = 0; k < rest.size(); ++k) {
      if (rest[k] != '"') continue;
      for (const bool flag : {true, false}) {
        const std::string_view marker = flag ? "\" string=\"true\">" : "\" string=\"false\">";
        if (rest.substr(k, marker.size()) != marker) continue;
        if (auto value = strip_suffix_py_dollar(rest.substr(k + marker.size()), "<"))
          return {std::string(rest.substr(0, k)), flag, std::string(*value)};
      }
    }
  }
  fail("tool call: malformed parameter {:?}", std::string(s));
}

// `text` without a trailing proper prefix of `marker` (a marker being written when the text
// was cut).
std::string_view drop_partial_marker(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(marker.size() - 1, text.size()); len > 0; --len)
    if (text.substr(text.size() - len) == marker.substr(0, len)) return text.substr(0, text.size() - len);
  return text;
}

// A JSON string as written so far: its text without the closing quote (escaping goes
// character by character, so this is a prefix of the whole string's text).
std::string open_json_string(std::string_view s) {
  std::string quoted = python_json_dumps(Json(std::string(s)));
  quoted.pop_back();
  return quoted;
}

// The argument text of one parameter, as parse_tool_calls writes it.
std::string argument_text(const Parameter& p) {
  return python_json_dumps(Json(p.name)) + ": " + (p.is_string ? python_json_dumps(Json(p.value)) : p.value);
}

// What the cut parameter `s` (the text after "<｜DSML｜parameter") adds to the arguments text
// and to `input`.
std::string cut_parameter(std::string_view s, Json& input) {
  constexpr std::string_view kName = " name=\"";
  constexpr std::string_view kFlag = "\" string=\"";
  if (s.substr(0, kName.size()) != kName) return "";  // the name is not begun
  const std::string_view rest = s.substr(kName.size());
  const size_t name_end = rest.find(kFlag);
  if (name_end == std::string_view::npos) return open_json_string(drop_partial_marker(rest, kFlag));
  const std::string name(rest.substr(0, name_end));
  std::string out = python_json_dumps(Json(name)) + ": ";
  const std::string_view flagged = rest.substr(name_end + kFlag.size());
  const std::string value_end = "</" + kDsml + "parameter";
  for (const bool is_string : {true, false}) {
    const std::string_view flag = is_string ? "true\">" : "false\">";
    if (flagged.substr(0, flag.size()) != flag) continue;
    const std::string_view value = drop_partial_marker(flagged.substr(flag.size()), value_end);
    if (is_string) {
      input[name] = std::string(value);
      return out + open_json_string(value);
    }
    if (Json::accept(value)) input[name] = Json::parse(value);
    return out + std::string(value);
  }
  return out;  // the string="..." flag is being written
}

}  // namespace

CutToolCalls parse_cut_tool_calls(std::string_view text, size_t begin) {
  CutToolCalls out;
  const std::string_view block = text.substr(begin);
  // The complete invokes: everything through the last </｜DSML｜invoke, closed as a whole block.
  std::string_view tail = block;
  if (const size_t last = block.rfind(kInvokeClose); last != std::string_view::npos) {
    const size_t after = last + kInvokeClose.size();
    const std::string whole = std::string(block.substr(0, after)) + ">\n" + kBlockClose;
    size_t end = 0;
    out.calls = parse_tool_calls(whole, 0, end);
    tail = block.substr(after);
    if ((">\n" + kBlockClose).starts_with(tail)) return out;  // the block was being closed
  }
  // The cut invoke (or one being opened, which has nothing to show yet).
  const std::string open = ">\n" + kInvokeOpen;
  if (open.starts_with(tail)) return out;
  if (!tail.starts_with(open)) fail("tool call: expected {:?} but got {:?}", open, std::string(tail.substr(0, 64)));
  const std::string_view invoke = tail.substr(open.size());
  constexpr std::string_view kName = " name=\"";
  const size_t name_end = invoke.find("\">");
  if (!invoke.starts_with(kName) || name_end == std::string_view::npos) return out;  // its name is not complete
  chat::ToolCall call;
  call.name = std::string(invoke.substr(kName.size(), name_end - kName.size()));
  call.arguments = "{";
  size_t at = name_end + 3;  // after ">\n"
  for (bool first = true; at < invoke.size(); first = false) {
    const std::string_view rest = invoke.substr(at);
    if (!rest.starts_with(kParamOpen)) break;  // a parameter being opened, or the invoke being closed
    const std::string_view param = rest.substr(kParamOpen.size());
    const size_t close = param.find(kParamClose);
    if (!first) call.arguments += ", ";
    if (close == std::string_view::npos) {  // the cut parameter
      call.arguments += cut_parameter(param, out.last_input);
      break;
    }
    const Parameter p = parse_parameter(param.substr(0, close));
    if (!p.is_string && !Json::accept(p.value))
      fail("tool call: parameter {:?} is marked string=\"false\" but {:?} is not JSON", p.name, p.value);
    out.last_input[p.name] = p.is_string ? Json(p.value) : Json::parse(p.value);
    call.arguments += argument_text(p);
    at += kParamOpen.size() + close + kParamClose.size() + 2;  // after ">\n"
  }
  out.calls.push_back(std::move(call));
  out.last_cut = true;
  return out;
}

std::string tool_calls_start() { return "\n\n<" + kDsml + "tool_calls"; }

chat::Prompt render_tool_calls(const Json& tool_calls) {
  if (!tool_calls.is_array()) fail("tool_calls must be an array");
  chat::Prompt out;
  out.add_template("\n\n<" + kDsml + "tool_calls>\n");
  bool first = true;
  for (const auto& call : tool_calls) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      fail("tool_calls: each call needs a function object");
    const Json& function = call["function"];
    if (!function.contains("name") || !function["name"].is_string()) fail("tool_calls: function.name must be a string");
    if (!first) out.add_template("\n");
    first = false;
    out.add_template("<" + kDsml + "invoke name=\"");
    out.add_caller(function["name"].get<std::string>());
    out.add_template("\">\n");
    out.add(render_arguments(function.contains("arguments") ? function["arguments"] : Json("{}")));
    out.add_template("\n</" + kDsml + "invoke>");
  }
  out.add_template("\n</" + kDsml + "tool_calls>");
  return out;
}

std::vector<chat::ToolCall> parse_tool_calls(std::string_view text, size_t index, size_t& end) {
  std::vector<chat::ToolCall> calls;
  for (;;) {
    Stop s = read_until(text, index, {kInvokeOpen, kBlockClose});
    if (text.substr(index, s.content_end - index) != ">\n")
      fail("tool call: expected \">\\n\" but got {:?}", std::string(text.substr(index, s.content_end - index)));
    if (s.which < 0) fail("tool call block is not closed with {}", kBlockClose);
    index = s.after;
    if (s.which == 1) break;

    s = read_until(text, index, {kParamOpen, kInvokeClose});
    if (s.which < 0) fail("tool call: invoke is not closed");
    chat::ToolCall call;
    call.name = parse_invoke_name(text.substr(index, s.content_end - index));
    index = s.after;
    std::vector<Parameter> params;
    while (s.which == 0) {
      const Stop p = read_until(text, index, {kParamClose});
      if (p.which < 0) fail("tool call: parameter is not closed");
      Parameter param = parse_parameter(text.substr(index, p.content_end - index));
      for (const auto& other : params)
        if (other.name == param.name) fail("tool call: duplicate parameter name {:?}", param.name);
      params.push_back(std::move(param));
      index = p.after;
      s = read_until(text, index, {kParamOpen, kInvokeClose});
      if (text.substr(index, s.content_end - index) != ">\n")
        fail("tool call: expected \">\\n\" after a parameter but got {:?}", std::string(text.substr(index, s.content_end - index)));
      if (s.which < 0) fail("tool call: invoke is not closed");
      index = s.after;
    }
    // Arguments text as the official decoder writes it: {"key": value, ...}, string values
    // JSON-quoted, other values verbatim — which must then be JSON (stricter than the official).
    std::string arguments = "{";
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].is_string && !Json::accept(params[i].value))
        fail("tool call: parameter {:?} is marked string=\"false\" but {:?} is not JSON", params[i].name, params[i].value);
      arguments += (i ? ", " : "") + argument_text(params[i]);
    }
    arguments += "}";
    call.arguments = std::move(arguments);
    calls.push_back(std::move(call));
  }
  end = index;
  return calls;
}

}  // namespace dsv4::text::dsml
