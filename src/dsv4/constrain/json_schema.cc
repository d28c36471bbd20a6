#include "dsv4/constrain/json_schema.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "dsv4/text/chat_format.h"

namespace dsv4::constrain {
namespace {

std::string join_path(const std::vector<std::string>& path) {
  std::string out;
  for (const std::string& seg : path) {
    if (!seg.empty() && seg.front() == '[') {
      out += seg;
    } else {
      if (!out.empty()) out += '.';
      out += seg;
    }
  }
  return out;
}

// The keywords the compiler enforces.
const std::set<std::string, std::less<>>& supported() {
  static const std::set<std::string, std::less<>> keys = {
      "type",     "properties", "required", "additionalProperties", "items",     "minItems",   "maxItems",
      "minLength", "maxLength", "enum",     "const",                "anyOf",     "$ref",       "$defs",
      "definitions", "uniqueItems", "$id", "pattern", "format", "oneOf", "minimum", "maximum", "exclusiveMinimum",
      "exclusiveMaximum"};
  return keys;
}

// The assertions and applicators of JSON Schema (drafts 4 to 2020-12) that it cannot enforce.
// Every keyword in neither list is an annotation.
const std::set<std::string, std::less<>>& unsupported_set() {
  static const std::set<std::string, std::less<>> keys = {
      "multipleOf",       "allOf",           "not",
      "if",               "then",             "else",             "dependencies",    "dependentRequired",
      "dependentSchemas", "patternProperties", "propertyNames",   "minProperties",   "maxProperties",
      "additionalItems",  "prefixItems",      "contains",         "minContains",     "maxContains",
      "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"};
  return keys;
}

// Keywords the specification makes inert without a partner: they assert nothing then.
bool inert(const Json& s, std::string_view key) {
  if (key == "then" || key == "else") return !s.contains("if");
  if (key == "additionalItems") return !(s.contains("items") && s["items"].is_array());
  if (key == "minContains" || key == "maxContains") return !s.contains("contains");
  return false;
}

const std::vector<std::string>& type_names() {
  static const std::vector<std::string> names = {"object", "array", "string", "number", "integer", "boolean", "null"};
  return names;
}

bool value_has_type(const Json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      const double x = v.get<double>();
      return std::isfinite(x) && std::floor(x) == x;
    }
    return false;
  }
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// ---- oneOf: whether exactly one alternative matching can be taken for granted ------------

// The schema a chain of local $refs leads to (bounded; a ref it cannot follow stays).
const Json& follow_refs(const Json& root, const Json& s) {
  const Json* at = &s;
  for (int hop = 0; hop < 16 && at->is_object() && at->contains("$ref") && (*at)["$ref"].is_string(); ++hop) {
    const std::string r = (*at)["$ref"].get<std::string>();
    if (r.empty() || r[0] != '#') break;
    try {
      const Json::json_pointer p(percent_decode(r.substr(1)));
      if (!root.contains(p)) break;
      at = &root.at(p);
    } catch (const Json::exception&) {
      break;
    }
  }
  return *at;
}

// The values an enum / const allows (nullopt: it lists none).
std::optional<std::vector<Json>> listed_values(const Json& s) {
  if (!s.is_object() || !(s.contains("enum") || s.contains("const"))) return std::nullopt;
  std::vector<Json> out;
  if (s.contains("enum") && s["enum"].is_array()) out.assign(s["enum"].begin(), s["enum"].end());
  if (s.contains("const")) {
    if (s.contains("enum")) std::erase_if(out, [&](const Json& v) { return v != s["const"]; });
    else out = {s["const"]};
  }
  return out;
}

// The types a schema admits: as a validator reads it, or as the compiler generates from it
// (which also reads the types other keywords imply).
std::set<std::string> admitted_types(const Json& s, bool generated) {
  const std::set<std::string> all(type_names().begin(), type_names().end());
  if (!s.is_object()) return all;
  if (const auto values = listed_values(s)) {
    std::set<std::string> out;
    for (const Json& v : *values)
      for (const std::string& t : type_names())
        if (value_has_type(v, t)) out.insert(t);
    return out;
  }
  if (s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf") || s.contains("$ref")) return all;
  if (s.contains("type")) {
    std::set<std::string> out;
    if (s["type"].is_string()) out.insert(s["type"].get<std::string>());
    else if (s["type"].is_array())
      for (const Json& t : s["type"])
        if (t.is_string()) out.insert(t.get<std::string>());
    return out;
  }
  if (!generated) return all;
  std::set<std::string> out;
  auto has = [&](std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      if (s.contains(k)) return true;
    return false;
  };
  if (has({"properties", "required", "additionalProperties"})) out.insert("object");
  if (has({"items", "minItems", "maxItems"})) out.insert("array");
  if (has({"minLength", "maxLength", "pattern"}) || (s.contains("format") && s["format"].is_string() &&
                                                     known_format(s["format"].get<std::string>())))
    out.insert("string");
  if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) out.insert("number");
  return out.empty() ? all : out;
}

bool types_overlap(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const std::string& t : a)
    for (const std::string& u : b)
      if (t == u || (t == "integer" && u == "number") || (t == "number" && u == "integer")) return true;
  return false;
}

bool values_disjoint(const std::vector<Json>& a, const std::vector<Json>& b) {
  for (const Json& v : a)
    if (std::find(b.begin(), b.end(), v) != b.end()) return false;
  return true;
}

// Whether every value the compiler generates from `a` fails `b`: their types cannot meet, their
// listed values differ, or a property `a` requires has constants `b` does not allow.
bool fails_other(const Json& root, const Json& a_in, const Json& b_in) {
  const Json& a = follow_refs(root, a_in);
  const Json& b = follow_refs(root, b_in);
  if (b.is_boolean()) return !b.get<bool>();
  if (a.is_boolean()) return !a.get<bool>();
  if (!types_overlap(admitted_types(a, true), admitted_types(b, false))) return true;
  const auto va = listed_values(a), vb = listed_values(b);
  if (va && vb) return values_disjoint(*va, *vb);
  if (!a.is_object() || !b.is_object() || !a.contains("required") || !a["required"].is_array() ||
      !a.contains("properties") || !b.contains("properties") || !a["properties"].is_object() || !b["properties"].is_object())
    return false;
  for (const Json& name : a["required"]) {
    if (!name.is_string()) continue;
    const std::string key = name.get<std::string>();
    if (!a["properties"].contains(key) || !b["properties"].contains(key)) continue;
    const auto pa = listed_values(follow_refs(root, a["properties"][key]));
    const auto pb = listed_values(follow_refs(root, b["properties"][key]));
    if (pa && pb && values_disjoint(*pa, *pb)) return true;  // a discriminator
  }
  return false;
}

}  // namespace

namespace {

std::string error_param(const std::string& where, const std::vector<std::string>& path, const std::string& keyword) {
  std::vector<std::string> p;
  if (!where.empty()) p.push_back(where);
  p.insert(p.end(), path.begin(), path.end());
  if (!keyword.empty()) p.push_back(keyword);
  return join_path(p);
}

std::string error_message(const std::string& where, const std::vector<std::string>& path, const std::string& keyword,
                          const std::string& reason) {
  const std::string p = error_param(where, path, keyword);
  return fmt::format("{} (at {})", reason, p.empty() ? "the schema's root" : p);
}

}  // namespace

SchemaError::SchemaError(std::vector<std::string> path, std::string keyword, const std::string& reason,
                         std::string where)
    : Error(error_message(where, path, keyword, reason)),
      path_(std::move(path)), keyword_(std::move(keyword)), reason_(reason), where_(std::move(where)) {}

std::string SchemaError::param() const { return error_param(where_, path_, keyword_); }

std::string dsml_marker() { return std::string(text::chat::kDsml); }

bool is_assertion(std::string_view keyword) { return supported().count(keyword) || unsupported_set().count(keyword); }

const std::vector<std::string>& unsupported_keywords() {
  static const std::vector<std::string> keys(unsupported_set().begin(), unsupported_set().end());
  return keys;
}

// One document being compiled: its root (refs resolve there), the current path, and the
// $ref targets compiled so far.
struct SchemaCompiler::Doc {
  const Json& root;
  bool safe;
  bool strict;  // refuse what cannot be enforced (else drop it)
  std::vector<std::string> path;
  size_t first_node;
  struct Target {
    NodeId node;
    bool in_progress;
    size_t containers;  // container depth when it was entered
  };
  std::map<std::string, Target> refs;
  size_t containers = 0;  // objects/arrays entered on the way here

  [[noreturn]] void error(const std::string& keyword, const std::string& why) const { throw SchemaError(path, keyword, why); }
};

namespace {

// Pushes a path segment for the lifetime of the guard.
class PathGuard {
 public:
  PathGuard(std::vector<std::string>& path, std::string seg) : path_(path) { path_.push_back(std::move(seg)); }
  ~PathGuard() { path_.pop_back(); }
  PathGuard(const PathGuard&) = delete;
  PathGuard& operator=(const PathGuard&) = delete;

 private:
  std::vector<std::string>& path_;
};

}  // namespace

SchemaCompiler::SchemaCompiler(Grammar& g, SchemaLimits limits) : g_(g), limits_(limits) {}
SchemaCompiler::~SchemaCompiler() = default;

std::string SchemaCompiler::forbid(bool dsml_safe) const { return dsml_safe ? dsml_marker() : std::string(); }

NodeId SchemaCompiler::any_value(bool safe) {
  NodeId& any = any_[safe ? 1 : 0];
  if (any != kNoNode) return any;
  any = g_.placeholder();
  const NodeId value = any;
  const NodeId object = g_.object(ObjectSyntax::kJson, {}, value, forbid(safe));
  const NodeId array = g_.array(value, 0, kUnbounded);
  const NodeId scalars = g_.literal({g_.symbols("true"), g_.symbols("false"), g_.symbols("null")});
  g_.define(any, g_.any_of({object, array, g_.string(0, kUnbounded, forbid(safe)), g_.number(false), scalars}));
  any_object_[safe ? 1 : 0] = object;
  return any;
}

NodeId SchemaCompiler::any_object(bool safe) {
  any_value(safe);
  return any_object_[safe ? 1 : 0];
}

void SchemaCompiler::check_budget(Doc& d, const std::string& keyword) {
  if (g_.node_count() - d.first_node > limits_.max_nodes)
    d.error(keyword, fmt::format("the schema is too large (more than {} parts)", limits_.max_nodes));
}

void SchemaCompiler::unsupported(bool strict, SchemaError e) {
  if (strict) throw e;
  dropped_.push_back(std::move(e));
}

void SchemaCompiler::unsupported(Doc& d, const std::string& keyword, const std::string& why) {
  unsupported(d.strict, SchemaError(d.path, keyword, why));
}

SchemaCompiler::Doc& SchemaCompiler::doc(const Json& document, bool dsml_safe, bool strict) {
  for (auto& d : docs_)
    if (&d->root == &document && d->safe == dsml_safe && d->strict == strict) return *d;
  docs_.push_back(std::make_unique<Doc>(Doc{document, dsml_safe, strict, {}, g_.node_count(), {}, 0}));
  Doc& d = *docs_.back();
  if (document.is_object() && document.contains("$id") && !document["$id"].is_string())
    d.error("$id", "\"$id\" must be a string");
  return d;
}

NodeId SchemaCompiler::compile(const Json& document, bool dsml_safe, bool strict) {
  return compile_part(document, document, {}, dsml_safe, strict);
}

NodeId SchemaCompiler::compile_part(const Json& document, const Json& part, std::vector<std::string> path,
                                    bool dsml_safe, bool strict) {
  Doc& d = doc(document, dsml_safe, strict);
  d.path = std::move(path);
  d.containers = 0;
  return compile_schema(d, part, d.path.size());
}

NodeId SchemaCompiler::compile_schema(Doc& d, const Json& s, size_t depth) {
  if (depth > limits_.max_depth) d.error("", fmt::format("the schema nests deeper than {} levels", limits_.max_depth));
  check_budget(d, "");
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value(d.safe);
    d.error("", "the schema false admits no value");
  }
  if (!s.is_object()) d.error("", "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items()) check_keyword(d, s, key, depth);
  for (const char* defs : {"$defs", "definitions"})
    if (s.contains(defs) && !s[defs].is_object()) d.error(defs, fmt::format("\"{}\" must be an object", defs));

  // Keywords that decide the whole schema, with no other enforced keyword beside them
  // (annotations and what check_keyword refused or dropped do not count).
  auto alone = [&](const char* keyword, std::initializer_list<const char*> also) {
    for (const auto& [key, value] : s.items()) {
      if (key == keyword || !supported().count(key) || key == "$defs" || key == "definitions" || key == "$id" ||
          key == "uniqueItems")
        continue;
      bool ok = false;
      for (const char* a : also) ok = ok || key == a;
      if (!ok) unsupported(d, key, fmt::format("\"{}\" cannot be combined with \"{}\" here", key, keyword));
    }
  };

  if (s.contains("$ref")) {
    alone("$ref", {});
    return compile_ref(d, s, depth);
  }
  if (s.contains("anyOf")) {
    alone("anyOf", {});
    const Json& alts = s["anyOf"];
    if (!alts.is_array() || alts.empty()) d.error("anyOf", "\"anyOf\" must be a non-empty array");
    if (alts.size() > limits_.max_alternatives)
      d.error("anyOf", fmt::format("\"anyOf\" has {} alternatives; at most {} are supported", alts.size(),
                                   limits_.max_alternatives));
    std::vector<NodeId> nodes;
    PathGuard guard(d.path, "anyOf");
    for (size_t i = 0; i < alts.size(); ++i) {
      PathGuard index(d.path, fmt::format("[{}]", i));
      nodes.push_back(compile_schema(d, alts[i], depth + 1));
    }
    return g_.any_of(std::move(nodes));
  }

  // oneOf beside other enforced keywords would be an intersection: refused (not strict: the
  // oneOf is dropped and the rest holds).
  std::string beside_one_of;
  if (s.contains("oneOf"))
    for (const auto& [key, value] : s.items())
      if (key != "oneOf" && supported().count(key) && key != "$defs" && key != "definitions" && key != "$id" &&
          key != "uniqueItems" && beside_one_of.empty())
        beside_one_of = key;
  if (!beside_one_of.empty())
    unsupported(d, "oneOf", fmt::format("\"oneOf\" beside \"{}\" is not supported", beside_one_of));
  if (s.contains("oneOf") && beside_one_of.empty()) {
    const Json& alts = s["oneOf"];
    if (!alts.is_array() || alts.empty()) d.error("oneOf", "\"oneOf\" must be a non-empty array");
    if (alts.size() > limits_.max_alternatives)
      d.error("oneOf", fmt::format("\"oneOf\" has {} alternatives; at most {} are supported", alts.size(),
                                   limits_.max_alternatives));
    // Generated as alternatives, which is exact when no value generated from one can match
    // another (different types, different constants, or a discriminating property).
    for (size_t i = 0; i < alts.size(); ++i)
      for (size_t j = i + 1; j < alts.size(); ++j)
        if (!fails_other(d.root, alts[i], alts[j]) || !fails_other(d.root, alts[j], alts[i])) {
          unsupported(d, "oneOf",
                      fmt::format("\"oneOf\" alternatives {} and {} may both match one value, so \"exactly one\" "
                                  "cannot be enforced (give them different types, or a required property with "
                                  "different constants)",
                                  i, j));
          i = alts.size();
          break;
        }
    std::vector<NodeId> nodes;
    PathGuard guard(d.path, "oneOf");
    for (size_t i = 0; i < alts.size(); ++i) {
      PathGuard index(d.path, fmt::format("[{}]", i));
      nodes.push_back(compile_schema(d, alts[i], depth + 1));
    }
    return g_.any_of(std::move(nodes));
  }

  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    auto add = [&](const Json& name) {
      if (!name.is_string() || std::find(type_names().begin(), type_names().end(), name.get<std::string>()) == type_names().end())
        d.error("type", "\"type\" must be one of object, array, string, number, integer, boolean, null (or a list of them)");
      if (std::find(types.begin(), types.end(), name.get<std::string>()) != types.end())
        d.error("type", "\"type\" lists a type twice");
      types.push_back(name.get<std::string>());
    };
    if (t.is_array()) {
      if (t.empty()) d.error("type", "\"type\" is an empty list: no value can satisfy it");
      for (const Json& name : t) add(name);
    } else {
      add(t);
    }
  }

  if (s.contains("enum") || s.contains("const")) {
    alone(s.contains("enum") ? "enum" : "const", {"type", "enum", "const", "pattern", "format", "minLength", "maxLength"});
    return compile_literal(d, s, types);
  }

  if (types.empty()) {
    // No type: the types the keywords describe, or any value.
    auto has = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys)
        if (s.contains(k)) return true;
      return false;
    };
    if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (has({"items", "minItems", "maxItems"})) types.push_back("array");
    if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
    if (has({"minLength", "maxLength", "pattern"}) || (s.contains("format") && known_format(s["format"].get<std::string>())))
      types.push_back("string");
    if (types.empty()) return any_value(d.safe);
  }
  const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
  std::vector<NodeId> nodes;
  for (const std::string& t : types) {
    if (t == "object") nodes.push_back(compile_object(d, s, depth));
    else if (t == "array") nodes.push_back(compile_array(d, s, depth));
    else if (t == "string") nodes.push_back(compile_string(d, s));
    else if (t == "number") nodes.push_back(compile_number(d, s, false));
    else if (t == "integer") {
      if (!has_number) nodes.push_back(compile_number(d, s, true));  // a number node already covers integers
    } else if (t == "boolean") nodes.push_back(g_.literal({g_.symbols("true"), g_.symbols("false")}, {"true", "false"}));
    else nodes.push_back(g_.literal({g_.symbols("null")}, {"null"}));
  }
  return g_.any_of(std::move(nodes));
}

// Annotations pass; assertions this compiler cannot enforce are refused or dropped.
void SchemaCompiler::check_keyword(Doc& d, const Json& s, const std::string& key, size_t depth) {
  if (unsupported_set().count(key) && !inert(s, key))
    return unsupported(d, key, fmt::format("unsupported JSON Schema keyword \"{}\"", key));
  if (key == "$id" && depth > 0) return unsupported(d, key, "\"$id\" is only supported at the root");
  const Json& value = s[key];
  if (key == "pattern" && !value.is_string()) d.error(key, "\"pattern\" must be a string");
  if (key == "format" && !value.is_string()) d.error(key, "\"format\" must be a string");
  if (key == "uniqueItems" && !(value.is_boolean() && !value.get<bool>()))
    unsupported(d, key, "unsupported JSON Schema keyword \"uniqueItems\" (only false is supported)");
}

NodeId SchemaCompiler::compile_ref(Doc& d, const Json& s, size_t depth) {
  const Json& ref = s["$ref"];
  if (!ref.is_string()) d.error("$ref", "\"$ref\" must be a string");
  const std::string r = ref.get<std::string>();
  if (r.empty() || r[0] != '#')
    d.error("$ref", fmt::format("only references within the schema (\"#…\") are supported, got \"{}\"", r));
  const std::string pointer = percent_decode(r.substr(1));
  if (auto it = d.refs.find(pointer); it != d.refs.end()) {
    if (it->second.in_progress && it->second.containers == d.containers)
      d.error("$ref", fmt::format("\"{}\" refers back to itself without an object or array in between", r));
    return it->second.node;
  }
  const Json* target = nullptr;
  try {
    const Json::json_pointer p(pointer);
    if (d.root.contains(p)) target = &d.root.at(p);
  } catch (const Json::exception&) {
  }
  if (!target) d.error("$ref", fmt::format("\"{}\" does not name a part of this schema", r));
  const NodeId placeholder = g_.placeholder();
  d.refs[pointer] = {placeholder, true, d.containers};
  // Errors inside the target name its place in the document. The outer path comes back on
  // every exit, an error included: the callers' PathGuards pop their segments from it.
  struct RestorePath {
    std::vector<std::string>& path;
    std::vector<std::string> saved;
    ~RestorePath() { path = std::move(saved); }
  } restore{d.path, std::move(d.path)};
  d.path.clear();
  for (size_t start = 1; start <= pointer.size();) {
    const size_t end = std::min(pointer.find('/', start), pointer.size());
    std::string seg = pointer.substr(start, end - start);
    for (size_t k; (k = seg.find("~1")) != std::string::npos;) seg.replace(k, 2, "/");
    for (size_t k; (k = seg.find("~0")) != std::string::npos;) seg.replace(k, 2, "~");
    d.path.push_back(std::move(seg));
    start = end + 1;
  }
  const NodeId node = compile_schema(d, *target, depth + 1);
  g_.define(placeholder, node);
  d.refs[pointer].in_progress = false;
  return placeholder;
}

NodeId SchemaCompiler::compile_literal(Doc& d, const Json& s, const std::vector<std::string>& types) {
  std::vector<Json> values;
  if (s.contains("enum")) {
    const Json& e = s["enum"];
    if (!e.is_array() || e.empty()) d.error("enum", "\"enum\" must be a non-empty array");
    for (const Json& v : e) values.push_back(v);
  }
  if (s.contains("const")) {
    const Json& c = s["const"];
    if (s.contains("enum")) {
      std::vector<Json> both;
      for (const Json& v : values)
        if (v == c) both.push_back(v);
      values = std::move(both);
    } else {
      values = {c};
    }
  }
  const std::string keyword = s.contains("enum") ? "enum" : "const";
  std::vector<std::vector<Symbol>> strings;
  std::vector<std::string> texts;
  std::set<std::string> seen;
  // String keywords beside the values drop the strings that break them.
  const auto [min_chars, max_chars] = string_lengths(d, s);
  const std::optional<ByteDfa> text = text_automaton(d, s);
  auto string_fits = [&](const std::string& str) {
    uint64_t chars = 0;
    for (char c : str) chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    return chars >= min_chars && chars <= max_chars && (!text || full_match(*text, str));
  };
  for (const Json& v : values) {
    if (!types.empty()) {
      bool ok = false;
      for (const std::string& t : types) ok = ok || value_has_type(v, t);
      if (!ok) continue;
    }
    if (v.is_string() && !string_fits(v.get<std::string>())) continue;
    std::string text = v.dump(-1, ' ', d.safe, Json::error_handler_t::strict);
    if (!seen.insert(text).second) continue;
    if (++enum_values_ > limits_.max_enum_values)
      d.error(keyword, fmt::format("too many enum/const values (at most {} in one request)", limits_.max_enum_values));
    literal_bytes_ += text.size();
    if (literal_bytes_ > limits_.max_literal_bytes)
      d.error(keyword, fmt::format("the enum/const values are too long (at most {} bytes of JSON in one request)",
                                   limits_.max_literal_bytes));
    std::vector<Symbol> sym;
    for (char c : text) sym.push_back(static_cast<uint8_t>(c));
    strings.push_back(std::move(sym));
    texts.push_back(std::move(text));
  }
  if (strings.empty()) d.error(keyword, fmt::format("no value of \"{}\" has the schema's type", keyword));
  return g_.literal(strings, std::move(texts));
}

NodeId SchemaCompiler::compile_object(Doc& d, const Json& s, size_t depth) {
  const Json* props = nullptr;
  if (s.contains("properties")) {
    props = &s["properties"];
    if (!props->is_object()) d.error("properties", "\"properties\" must be an object");
    if (props->size() > limits_.max_properties)
      d.error("properties", fmt::format("{} properties; at most {} are supported in one object", props->size(),
                                        limits_.max_properties));
  }
  std::vector<std::string> required;
  if (s.contains("required")) {
    const Json& r = s["required"];
    if (!r.is_array()) d.error("required", "\"required\" must be an array of property names");
    for (const Json& name : r) {
      if (!name.is_string()) d.error("required", "\"required\" must be an array of property names");
      if (std::find(required.begin(), required.end(), name.get<std::string>()) != required.end())
        d.error("required", fmt::format("\"required\" names \"{}\" twice", name.get<std::string>()));
      required.push_back(name.get<std::string>());
    }
  }
  ++d.containers;
  NodeId additional = kNoNode;
  if (s.contains("additionalProperties")) {
    const Json& a = s["additionalProperties"];
    if (!a.is_boolean() && !a.is_object()) d.error("additionalProperties", "\"additionalProperties\" must be a boolean or a schema");
    if (!(a.is_boolean() && !a.get<bool>())) {
      PathGuard guard(d.path, "additionalProperties");
      additional = compile_schema(d, a, depth + 1);
    }
  } else {
    additional = any_value(d.safe);
  }

  std::vector<Property> properties;
  auto key_text = [&](const std::string& name) {
    return Json(name).dump(-1, ' ', d.safe, Json::error_handler_t::strict);
  };
  if (props) {
    PathGuard guard(d.path, "properties");
    for (const auto& [name, schema] : props->items()) {
      PathGuard key(d.path, name);
      Property p;
      p.name = name;
      p.key = key_text(name);
      p.value = compile_schema(d, schema, depth + 1);
      p.required = std::find(required.begin(), required.end(), name) != required.end();
      properties.push_back(std::move(p));
    }
  }
  // Required names the schema does not describe are other keys (when those are allowed).
  for (const std::string& name : required) {
    if (props && props->contains(name)) continue;
    if (additional == kNoNode)
      d.error("required", fmt::format("\"{}\" is required, but it is not in \"properties\" and "
                                      "\"additionalProperties\" is false",
                                      name));
    Property p;
    p.name = name;
    p.key = key_text(name);
    p.value = additional;
    p.required = true;
    properties.push_back(std::move(p));
  }
  --d.containers;
  check_budget(d, "properties");
  return g_.object(ObjectSyntax::kJson, std::move(properties), additional, forbid(d.safe));
}

NodeId SchemaCompiler::compile_array(Doc& d, const Json& s, size_t depth) {
  auto bound = [&](const char* key, uint32_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      d.error(key, fmt::format("\"{}\" must be a non-negative integer", key));
    const uint64_t x = v.get<uint64_t>();
    return static_cast<uint32_t>(std::min<uint64_t>(x, kUnbounded - 1));
  };
  const uint32_t lo = bound("minItems", 0), hi = bound("maxItems", kUnbounded);
  if (lo > hi) d.error("minItems", "\"minItems\" is larger than \"maxItems\": no array can satisfy both");
  NodeId item;
  ++d.containers;
  if (s.contains("items")) {
    const Json& it = s["items"];
    if (it.is_array()) {
      unsupported(d, "items", "\"items\" as a list (tuples) is not supported; use a single schema");
      --d.containers;
      return g_.array(any_value(d.safe), lo, hi);
    }
    if (it.is_boolean() && !it.get<bool>()) {
      --d.containers;
      if (lo > 0) d.error("items", "\"items\" is false but \"minItems\" is above 0: no array can satisfy both");
      return g_.literal({g_.symbols("[]")}, {"[]"});
    }
    PathGuard guard(d.path, "items");
    item = compile_schema(d, it, depth + 1);
  } else {
    item = any_value(d.safe);
  }
  --d.containers;
  return g_.array(item, lo, hi);
}

namespace {

// The magnitudes m (texts I or I.F) with A <= m (A < m when `a_open`) and m <= B (m < B when
// `b_open`; no B: up to the largest generated integer part, any fraction). Whole A and B.
std::string magnitude_pattern(uint64_t a, bool a_open, std::optional<uint64_t> b, bool b_open, bool integer,
                              uint64_t cap) {
  const std::string any_fraction = integer ? "" : "(?:\\.\\d+)?", zero_fraction = integer ? "" : "(?:\\.0+)?";
  if (integer) {  // whole bounds, inclusive
    const uint64_t lo = a + (a_open ? 1 : 0);
    const uint64_t hi = b ? *b - (b_open ? 1 : 0) : cap;
    if ((b && b_open && *b == 0) || lo > hi) return "";
    return "(?:" + integer_range_pattern(lo, hi) + ")";
  }
  if (b && (*b < a || (*b == a && (a_open || b_open)))) return "";
  if (b && *b == a) return std::to_string(a) + zero_fraction;
  std::vector<std::string> alts;
  alts.push_back(std::to_string(a) + (a_open ? "\\.\\d*[1-9]\\d*" : any_fraction));  // integer part A
  const uint64_t top = b ? *b - 1 : cap;
  if (a + 1 <= top) alts.push_back("(?:" + integer_range_pattern(a + 1, top) + ")" + any_fraction);
  if (b && !b_open) alts.push_back(std::to_string(*b) + zero_fraction);  // integer part B: B itself only
  std::string out;
  for (const std::string& alt : alts) out += (out.empty() ? "" : "|") + alt;
  return "(?:" + out + ")";
}

}  // namespace

// minimum / maximum / exclusiveMinimum / exclusiveMaximum (draft-4 booleans or 2020-12
// numbers): the number's text as an automaton over sign, integer part and fraction (no
// exponent). Integers take any bounds; numbers whole-number bounds.
NodeId SchemaCompiler::compile_number(Doc& d, const Json& s, bool integer) {
  struct Bound {
    bool set = false;
    double value = 0;
    bool open = false;  // exclusive
    const char* keyword = "";
  } lo, hi;
  auto number = [&](const char* key) {
    const Json& v = s[key];
    if (!v.is_number()) d.error(key, fmt::format("\"{}\" must be a number", key));
    return v.get<double>();
  };
  if (s.contains("minimum")) lo = {true, number("minimum"), false, "minimum"};
  if (s.contains("maximum")) hi = {true, number("maximum"), false, "maximum"};
  for (const char* key : {"exclusiveMinimum", "exclusiveMaximum"}) {
    if (!s.contains(key)) continue;
    Bound& b = std::string_view(key) == "exclusiveMinimum" ? lo : hi;
    const Json& v = s[key];
    if (v.is_boolean()) {  // draft 4: makes minimum / maximum exclusive
      if (v.get<bool>() && b.set) b.open = true;
      continue;
    }
    const double x = number(key);
    const bool tighter = !b.set || (&b == &lo ? x >= b.value : x <= b.value);
    if (tighter) b = {true, x, true, key};
  }
  if (!lo.set && !hi.set) return g_.number(integer);
  constexpr double kCap = 999999999999999.0;  // the largest integer part generated (15 digits)
  if (!integer) {
    for (Bound* b : {&lo, &hi})
      if (b->set && std::floor(b->value) != b->value) {
        unsupported(d, b->keyword, fmt::format("\"{}\": {} on a number: only whole-number bounds are supported", b->keyword, b->value));
        b->set = false;
      }
  } else {  // whole bounds, inclusive
    if (lo.set) lo = {true, lo.open ? std::floor(lo.value) + 1 : std::ceil(lo.value), false, lo.keyword};
    if (hi.set) hi = {true, hi.open ? std::ceil(hi.value) - 1 : std::floor(hi.value), false, hi.keyword};
  }
  if (!lo.set && !hi.set) return g_.number(integer);
  if ((lo.set && lo.value > kCap) || (hi.set && hi.value < -kCap))
    d.error(lo.set && lo.value > kCap ? lo.keyword : hi.keyword, "the bound is beyond the 15-digit numbers generated");
  if (lo.set && lo.value < -kCap) lo.set = false;
  if (hi.set && hi.value > kCap) hi.set = false;
  const uint64_t cap = static_cast<uint64_t>(kCap);
  std::string alts;
  // Zero and above.
  if (!hi.set || hi.value > 0 || (hi.value == 0 && !hi.open)) {
    const bool from_lo = lo.set && lo.value >= 0;
    const std::string p = magnitude_pattern(from_lo ? uint64_t(lo.value) : 0, from_lo && lo.open,
                                            hi.set ? std::optional<uint64_t>(uint64_t(hi.value)) : std::nullopt,
                                            hi.set && hi.open, integer, cap);
    alts += p;
  }
  // Below zero: "-" and a magnitude above 0 (or above -maximum).
  if (!lo.set || lo.value < 0) {
    const bool from_hi = hi.set && hi.value < 0;
    const std::string p = magnitude_pattern(from_hi ? uint64_t(-hi.value) : 0, from_hi ? hi.open : true,
                                            lo.set ? std::optional<uint64_t>(uint64_t(-lo.value)) : std::nullopt,
                                            lo.set && lo.open, integer, cap);
    if (!p.empty()) alts += (alts.empty() ? "-" : "|-") + p;
  }
  if (alts.empty())
    d.error(lo.set ? lo.keyword : hi.keyword, fmt::format("no {} satisfies both bounds", integer ? "integer" : "number"));
  const NodeId node = g_.pattern_number(regex_dfa("^(?:" + alts + ")$", automaton_budget(d, lo.set ? lo.keyword : hi.keyword)));
  automaton_states_ += g_.dfa(g_.node(node).index).size();
  return node;
}

std::pair<uint32_t, uint32_t> SchemaCompiler::string_lengths(Doc& d, const Json& s) {
  auto bound = [&](const char* key, uint32_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      d.error(key, fmt::format("\"{}\" must be a non-negative integer", key));
    return static_cast<uint32_t>(std::min<uint64_t>(v.get<uint64_t>(), kUnbounded - 1));
  };
  const uint32_t lo = bound("minLength", 0), hi = bound("maxLength", kUnbounded);
  if (lo > hi) d.error("minLength", "\"minLength\" is larger than \"maxLength\": no string can satisfy both");
  return {lo, hi};
}

// What one request may still build, all its patterns together (each is bounded by itself too).
uint32_t SchemaCompiler::automaton_budget(Doc& d, const char* keyword) const {
  if (automaton_states_ >= limits_.max_automaton_states)
    d.error(keyword, fmt::format("the schema's patterns and formats are too large together (more than {} automaton states)",
                                 limits_.max_automaton_states));
  return static_cast<uint32_t>(std::min<uint64_t>(kMaxDfaStates, limits_.max_automaton_states - automaton_states_));
}

std::optional<ByteDfa> SchemaCompiler::text_automaton(Doc& d, const Json& s) {
  auto budget = [&](const char* keyword) { return automaton_budget(d, keyword); };
  auto spend = [&](const std::optional<ByteDfa>& a) {
    if (a) automaton_states_ += a->size();
  };
  std::optional<ByteDfa> dfa;
  if (s.contains("pattern")) {
    const std::string pattern = s["pattern"].get<std::string>();
    try {
      dfa = regex_dfa(pattern, budget("pattern"));
      spend(dfa);
    } catch (const SchemaError&) {
      throw;
    } catch (const Error& e) {
      unsupported(d, "pattern", fmt::format("\"pattern\" {}: {}", Json(pattern).dump(), e.what()));
    }
  }
  if (s.contains("format") && known_format(s["format"].get<std::string>())) {
    const std::string format = s["format"].get<std::string>();
    const ByteDfa& f = format_dfa(format);
    if (dfa) {
      try {
        dfa = intersect(*dfa, f, budget("format"));
        spend(dfa);
      } catch (const Error& e) {
        unsupported(d, "format", e.what());
        return dfa;
      }
      if (dfa->start == ByteDfa::kDead) d.error("format", fmt::format("no {} string matches \"pattern\"", format));
    } else {
      dfa = f;
    }
  }
  return dfa;
}

NodeId SchemaCompiler::compile_string(Doc& d, const Json& s) {
  const auto [lo, hi] = string_lengths(d, s);
  std::optional<ByteDfa> dfa = text_automaton(d, s);
  if (!dfa) return g_.string(lo, hi, forbid(d.safe));
  // Pattern and format: one automaton, the lengths and (inside DSML) the marker folded in.
  ByteDfa text = *dfa;
  const std::string keyword = s.contains("pattern") ? "pattern" : "format";
  if (lo > 0 || hi != kUnbounded) {
    try {
      text = bound_length(text, lo, hi, automaton_budget(d, "maxLength"));
      automaton_states_ += text.size();
    } catch (const Error& e) {
      unsupported(d, s.contains("maxLength") ? "maxLength" : "minLength", e.what());
    }
    if (text.start == ByteDfa::kDead)
      d.error(keyword, fmt::format("no string matching \"{}\" has between {} and {} characters", keyword, lo,
                                   hi == kUnbounded ? std::string("any number of") : std::to_string(hi)));
  }
  if (d.safe) text = excluding(text, dsml_marker());
  const NodeId node = g_.pattern_string(text);
  if (node == kNoNode)
    d.error(keyword, fmt::format("no string matching \"{}\" can be written without \\u escapes", keyword));
  return node;
}

}  // namespace dsv4::constrain
