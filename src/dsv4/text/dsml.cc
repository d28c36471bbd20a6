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

}  // namespace

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
      if (i) arguments += ", ";
      arguments += python_json_dumps(Json(params[i].name)) + ": ";
      if (params[i].is_string) {
        arguments += python_json_dumps(Json(params[i].value));
      } else {
        if (!Json::accept(params[i].value))
          fail("tool call: parameter {:?} is marked string=\"false\" but {:?} is not JSON", params[i].name, params[i].value);
        arguments += params[i].value;
      }
    }
    arguments += "}";
    call.arguments = std::move(arguments);
    calls.push_back(std::move(call));
  }
  end = index;
  return calls;
}

}  // namespace dsv4::text::dsml
