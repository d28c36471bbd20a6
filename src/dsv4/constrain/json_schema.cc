#include "dsv4/constrain/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "dsv4/constrain/schema_algebra.h"
#include "dsv4/constrain/schema_refs.h"
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
      "exclusiveMaximum", "allOf", "unevaluatedProperties", "multipleOf", "prefixItems", "additionalItems", "not",
      "if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas", "minProperties", "maxProperties",
      "patternProperties", "propertyNames", "contains", "minContains", "maxContains"};
  return keys;
}

// The assertions and applicators of JSON Schema (drafts 4 to 2020-12) that it cannot enforce.
// Every keyword in neither list is an annotation.
const std::set<std::string, std::less<>>& unsupported_set() {
  static const std::set<std::string, std::less<>> keys = {"unevaluatedItems", "$dynamicRef", "$recursiveRef"};
  return keys;
}

// A count keyword's value (minLength, maxItems, …): a non-negative integer, also written as a
// whole float (2.0), as JSON Schema allows.
std::optional<uint64_t> count_value(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return std::nullopt;  // negative
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (x >= 0 && x <= 9007199254740992.0 && std::floor(x) == x) return static_cast<uint64_t>(x);
  }
  return std::nullopt;
}

std::string escaped_key(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
  return out;
}

// Where `target` sits inside `doc` (by address).
std::optional<Json::json_pointer> pointer_to(const Json& doc, const Json* target, int depth = 0) {
  if (&doc == target) return Json::json_pointer();
  if (depth > 256 || !doc.is_structured()) return std::nullopt;
  if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it)
      if (auto p = pointer_to(it.value(), target, depth + 1)) return Json::json_pointer("/" + escaped_key(it.key())) / *p;
  } else {
    for (size_t i = 0; i < doc.size(); ++i)
      if (auto p = pointer_to(doc[i], target, depth + 1)) return Json::json_pointer("/" + std::to_string(i)) / *p;
  }
  return std::nullopt;
}

// Keywords the specification makes inert without a partner: they assert nothing then.
bool inert(const Json& s, std::string_view key) {
  if (key == "then" || key == "else") return !s.contains("if");
  if (key == "additionalItems") return !(s.contains("items") && s["items"].is_array());
  if (key == "minContains" || key == "maxContains") return !s.contains("contains");
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
  const Json& root;      // the document, or its copy with references made local
  const Json* original;  // the document the caller holds
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
  // One drop per place (alternatives rewritten from one schema compile its parts again).
  for (const SchemaError& d : dropped_)
    if (d.param() == e.param()) return;
  dropped_.push_back(std::move(e));
}

void SchemaCompiler::unsupported(Doc& d, const std::string& keyword, const std::string& why) {
  unsupported(d.strict, SchemaError(d.path, keyword, why));
}

SchemaCompiler::Doc& SchemaCompiler::doc(const Json& document, bool dsml_safe, bool strict) {
  for (auto& d : docs_)
    if (d->original == &document && d->safe == dsml_safe && d->strict == strict) return *d;
  // References by $id, $anchor or URI become pointers within the document (schema_refs.h).
  const Json* root = &document;
  if (std::optional<Json> local = with_local_refs(document)) {
    local_docs_.push_back(std::make_unique<Json>(std::move(*local)));
    root = local_docs_.back().get();
  }
  docs_.push_back(std::make_unique<Doc>(Doc{*root, &document, dsml_safe, strict, {}, g_.node_count(), {}, 0}));
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
  const Json* at = &part;
  if (&d.root != &document) {  // the same place in the copy
    const std::optional<Json::json_pointer> where = pointer_to(document, &part);
    if (!where) fail("constrain: a schema part outside its document");
    at = &d.root.at(*where);
  }
  return compile_schema(d, *at, d.path.size());
}

NodeId SchemaCompiler::compile_schema(Doc& d, const Json& s, size_t depth) {
  if (depth > limits_.max_depth) d.error("", fmt::format("the schema nests deeper than {} levels", limits_.max_depth));
  check_budget(d, "");
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value(d.safe);
    d.error("", "the schema false admits no value");
  }
  if (!s.is_object()) d.error("", "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items()) check_keyword(d, s, key);
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

  // allOf, unevaluatedProperties and applicators beside other keywords: rewritten as
  // alternatives of plain schemas (schema_algebra.h). A trivial allOf (one part asserts, the
  // rest and the holder only annotate: pydantic's field with a description) is its part, so a
  // $ref in it stays a reference and recursion stays finite.
  if (const Json* part = sole_part(s)) {
    PathGuard guard(d.path, "allOf");
    PathGuard index(d.path, fmt::format("[{}]", part - &s["allOf"][0]));
    return compile_schema(d, *part, depth + 1);
  }
  if (needs_merge(s)) return compile_merged(d, s, depth);

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
    return compile_alternatives(d, alts, "anyOf", depth);
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
    return compile_alternatives(d, alts, "oneOf", depth);
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

  // "not" of types and constants (others were rewritten, schema_algebra.h).
  const Excluded ex = s.contains("not") ? excluded(d, s["not"]) : Excluded{};

  if (s.contains("enum") || s.contains("const")) {
    alone(s.contains("enum") ? "enum" : "const",
          {"type", "enum", "const", "pattern", "format", "minLength", "maxLength", "not"});
    return compile_literal(d, s, types, ex);
  }

  if (types.empty()) {
    // No type: the types the keywords describe, or any value.
    types = implied_types(s);
    if (types.empty() && ex.types.empty() && ex.values.empty()) return any_value(d.safe);
    if (types.empty()) types = {"object", "array", "string", "number", "boolean", "null"};
  }
  auto listed = [](const std::vector<std::string>& list, const char* t) {
    return std::find(list.begin(), list.end(), t) != list.end();
  };
  if (listed(ex.types, "integer") && listed(types, "number") && !listed(ex.types, "number"))
    unsupported(d, "not", "\"not\" of integers among numbers is not supported");
  std::erase_if(types, [&](const std::string& t) {
    return listed(ex.types, t.c_str()) || (t == "integer" && listed(ex.types, "number"));
  });
  if (types.empty()) d.error("not", "\"not\" excludes every type the schema allows");
  // The constants "not" excludes, by type.
  std::vector<std::string> strings;
  std::vector<Json> numbers;
  bool no_true = false, no_false = false, no_null = false;
  for (const Json& v : ex.values) {
    if (v.is_string()) strings.push_back(v.get<std::string>());
    else if (v.is_number()) numbers.push_back(v);
    else if (v.is_boolean()) (v.get<bool>() ? no_true : no_false) = true;
    else if (v.is_null()) no_null = true;
    else if ((v.is_object() && listed(types, "object")) || (v.is_array() && listed(types, "array")))
      unsupported(d, "not", "\"not\" of an object or array constant is not supported");
  }
  const bool has_number = listed(types, "number");
  std::vector<NodeId> nodes;
  for (const std::string& t : types) {
    if (t == "object") nodes.push_back(compile_object(d, s, depth));
    else if (t == "array") nodes.push_back(compile_array(d, s, depth));
    else if (t == "string") nodes.push_back(compile_string(d, s, strings));
    else if (t == "number") nodes.push_back(compile_number(d, s, false, numbers));
    else if (t == "integer") {
      if (!has_number) nodes.push_back(compile_number(d, s, true, numbers));  // a number node already covers integers
    } else if (t == "boolean") {
      std::vector<std::vector<Symbol>> symbols;
      std::vector<std::string> texts;
      for (const char* b : {"true", "false"})
        if (!(b[0] == 't' ? no_true : no_false)) symbols.push_back(g_.symbols(b)), texts.push_back(b);
      if (!symbols.empty()) nodes.push_back(g_.literal(symbols, texts));
    } else if (!no_null) {
      nodes.push_back(g_.literal({g_.symbols("null")}, {"null"}));
    }
  }
  if (nodes.empty()) d.error("not", "\"not\" excludes every value the schema allows");
  return g_.any_of(std::move(nodes));
}

// The types and constants a simple "not" names.
SchemaCompiler::Excluded SchemaCompiler::excluded(Doc& d, const Json& n) {
  Excluded out;
  if (!simple_exclusion(n)) {
    unsupported(d, "not", "this \"not\" cannot be enforced");
    return out;
  }
  collect_exclusion(n, out.types, out.values);
  return out;
}

// The alternatives of anyOf / oneOf, each at its index; false ones match nothing and are left out.
NodeId SchemaCompiler::compile_alternatives(Doc& d, const Json& alts, const char* keyword, size_t depth) {
  std::vector<NodeId> nodes;
  PathGuard guard(d.path, keyword);
  for (size_t i = 0; i < alts.size(); ++i) {
    if (alts[i] == Json(false)) continue;
    PathGuard index(d.path, fmt::format("[{}]", i));
    nodes.push_back(compile_schema(d, alts[i], depth + 1));
  }
  if (nodes.empty()) d.error("", fmt::format("every alternative of \"{}\" is false: no value satisfies it", keyword));
  return g_.any_of(std::move(nodes));
}

// Annotations pass; assertions this compiler cannot enforce are refused or dropped.
void SchemaCompiler::check_keyword(Doc& d, const Json& s, const std::string& key) {
  if (unsupported_set().count(key) && !inert(s, key))
    return unsupported(d, key, fmt::format("unsupported JSON Schema keyword \"{}\"", key));
  if (key == "$id" && !s[key].is_string()) d.error(key, "\"$id\" must be a string");
  const Json& value = s[key];
  if (key == "pattern" && !value.is_string()) d.error(key, "\"pattern\" must be a string");
  if (key == "format" && !value.is_string()) d.error(key, "\"format\" must be a string");
  if (key == "uniqueItems" && !(value.is_boolean() && !value.get<bool>()))
    unsupported(d, key, "unsupported JSON Schema keyword \"uniqueItems\" (only false is supported)");
}

NodeId SchemaCompiler::compile_merged(Doc& d, const Json& s, size_t depth) {
  MergeContext c{d.root, [&](const std::string& keyword, const std::string& why) { unsupported(d, keyword, why); },
                 [&](const std::string& keyword, const std::string& why) { d.error(keyword, why); },
                 limits_.max_alternatives, merge_values_left_};
  const std::vector<Json> alternatives = plain_alternatives(c, s);
  merge_values_left_ = c.values_left;
  if (alternatives.empty()) {
    std::string keyword;
    for (const char* k : {"allOf", "$ref", "anyOf", "oneOf", "not", "if", "dependentRequired", "dependentSchemas", "dependencies"})
      if (keyword.empty() && s.contains(k)) keyword = k;
    d.error(keyword, "no value satisfies every part of the schema (their types, constants or required names never meet)");
  }
  // An alternative that cannot be compiled (no value satisfies one of its properties, say) is
  // left out: the others still give only valid answers. None left: the first one's error.
  std::vector<NodeId> nodes;
  std::optional<SchemaError> first;
  for (const Json& alternative : alternatives) {
    const auto refs = d.refs;
    const size_t containers = d.containers;
    const size_t dropped = dropped_.size();
    try {
      nodes.push_back(compile_schema(d, alternative, depth + 1));
    } catch (const SchemaError& e) {
      if (alternatives.size() == 1) throw;
      if (!first) first = e;
      d.refs = refs;  // targets begun inside it were never finished
      d.containers = containers;
      dropped_.erase(dropped_.begin() + static_cast<std::ptrdiff_t>(dropped), dropped_.end());
    }
  }
  if (nodes.empty()) throw *first;
  return g_.any_of(std::move(nodes));
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

NodeId SchemaCompiler::compile_literal(Doc& d, const Json& s, const std::vector<std::string>& types,
                                       const Excluded& ex) {
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
  const std::pair<uint32_t, uint32_t> lengths = string_lengths(d, s);
  const uint32_t min_chars = lengths.first, max_chars = lengths.second;
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
    if (std::find(ex.values.begin(), ex.values.end(), v) != ex.values.end()) continue;
    if (std::any_of(ex.types.begin(), ex.types.end(), [&](const std::string& t) { return value_has_type(v, t); })) continue;
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

  // patternProperties: a pattern's schema holds for every key it matches, declared or not;
  // propertyNames: an automaton every key's text must match.
  struct KeyPattern {
    std::string pattern;
    const Json* schema;
    ByteDfa dfa;
  };
  std::vector<KeyPattern> patterns;
  std::vector<ByteDfa> forbidden_patterns;
  if (s.contains("patternProperties")) {
    const Json& pp = s["patternProperties"];
    if (!pp.is_object()) d.error("patternProperties", "\"patternProperties\" must be an object");
    for (const auto& [pattern, schema] : pp.items()) {
      try {
        ByteDfa dfa = regex_dfa(pattern, automaton_budget(d, "patternProperties"));
        automaton_states_ += dfa.size();
        if (schema == Json(false)) {  // keys it matches are forbidden
          forbidden_patterns.push_back(std::move(dfa));
          continue;
        }
        patterns.push_back({pattern, &schema, std::move(dfa)});
      } catch (const SchemaError&) {
        throw;
      } catch (const Error& e) {
        unsupported(d, "patternProperties", fmt::format("\"patternProperties\" {}: {}", Json(pattern).dump(), e.what()));
      }
    }
  }
  const std::optional<ByteDfa> names = s.contains("propertyNames") ? name_automaton(d, s["propertyNames"]) : std::nullopt;
  // The schema a key's value must meet: its own, with every pattern that matches the name.
  auto value_for = [&](const std::string& name, const Json* own) -> NodeId {
    Json parts = Json::array();
    if (own) parts.push_back(*own);
    for (const KeyPattern& k : patterns)
      if (full_match(k.dfa, name)) parts.push_back(*k.schema);
    if (parts.empty()) return additional;
    if (parts.size() == 1) return own ? compile_schema(d, *own, depth + 1) : compile_schema(d, parts[0], depth + 1);
    const Json all = Json{{"allOf", std::move(parts)}};
    return compile_schema(d, all, depth + 1);
  };
  auto name_allowed = [&](const std::string& name) {
    for (const ByteDfa& f : forbidden_patterns)
      if (full_match(f, name)) return false;
    return !names || full_match(*names, name);
  };

  std::vector<Property> properties;
  auto key_text = [&](const std::string& name) {
    return Json(name).dump(-1, ' ', d.safe, Json::error_handler_t::strict);
  };
  std::vector<std::string> forbidden;  // properties whose schema is false, or whose name propertyNames refuses
  auto is_required = [&](const std::string& name) {
    return std::find(required.begin(), required.end(), name) != required.end();
  };
  if (props) {
    PathGuard guard(d.path, "properties");
    for (const auto& [name, schema] : props->items()) {
      PathGuard key(d.path, name);
      // false, or not of a schema that asserts nothing: no value, so the name is forbidden.
      const bool never = schema == Json(false) ||
                         (schema.is_object() && schema.contains("not") && asserts_nothing(schema["not"]));
      if (never || !name_allowed(name)) {
        if (is_required(name))
          d.error("", fmt::format("\"{}\" is required, but {}", name,
                                  never ? "its schema admits no value" : "\"propertyNames\" does not allow it"));
        forbidden.push_back(name);
        continue;
      }
      Property p;
      p.name = name;
      p.key = key_text(name);
      p.value = value_for(name, &schema);
      p.required = is_required(name);
      properties.push_back(std::move(p));
    }
  }
  // Required names the schema does not describe are other keys (when those are allowed).
  for (const std::string& name : required) {
    if (props && props->contains(name)) continue;
    if (!name_allowed(name)) d.error("required", fmt::format("\"{}\" is required, but \"propertyNames\" does not allow it", name));
    Property p;
    p.name = name;
    p.key = key_text(name);
    {
      PathGuard guard(d.path, "required");
      p.value = value_for(name, nullptr);
    }
    if (p.value == kNoNode)
      d.error("required", fmt::format("\"{}\" is required, but it is not in \"properties\" and "
                                      "\"additionalProperties\" is false",
                                      name));
    p.required = true;
    properties.push_back(std::move(p));
  }
  // Other keys: with patternProperties, keys the first pattern matches (their values meet
  // every pattern that may match them too), which is always valid and what such maps are
  // for; else additionalProperties' keys. propertyNames narrows them; declared names are
  // left out of the automaton.
  NodeId free_key = kNoNode;
  if (!patterns.empty() || names || !forbidden_patterns.empty()) {
    std::optional<ByteDfa> keys;
    NodeId value = additional;
    if (!patterns.empty()) {
      keys = patterns[0].dfa;
      Json parts = Json::array({*patterns[0].schema});
      for (size_t i = 1; i < patterns.size(); ++i)
        if (intersect(patterns[0].dfa, patterns[i].dfa, automaton_budget(d, "patternProperties")).start != ByteDfa::kDead)
          parts.push_back(*patterns[i].schema);
      PathGuard guard(d.path, "patternProperties");
      PathGuard key(d.path, patterns[0].pattern);
      const Json all = parts.size() == 1 ? parts[0] : Json{{"allOf", std::move(parts)}};
      value = compile_schema(d, all, depth + 1);
    } else if (additional != kNoNode) {
      keys = regex_dfa("");
    }
    if (keys) {
      try {
        if (names) keys = intersect(*keys, *names, automaton_budget(d, "propertyNames"));
        for (const ByteDfa& f : forbidden_patterns) keys = subtract(*keys, f, automaton_budget(d, "patternProperties"));
        std::vector<std::string> taken = forbidden;
        for (const Property& p : properties) taken.push_back(p.name);
        if (!taken.empty()) keys = subtract(*keys, literal_set_dfa(taken), automaton_budget(d, "properties"));
        if (d.safe) keys = excluding(*keys, dsml_marker());
        automaton_states_ += keys->size();
        free_key = keys->start == ByteDfa::kDead ? kNoNode : g_.pattern_string(*keys);
      } catch (const SchemaError&) {
        throw;
      } catch (const Error& e) {
        unsupported(d, patterns.empty() ? "propertyNames" : "patternProperties", e.what());
      }
      additional = free_key == kNoNode ? kNoNode : value;
    }
  }
  --d.containers;
  // minProperties / maxProperties where the shape already decides them.
  auto count = [&](const char* key) -> std::optional<uint64_t> {
    if (!s.contains(key)) return std::nullopt;
    const std::optional<uint64_t> v = count_value(s[key]);
    if (!v) d.error(key, fmt::format("\"{}\" must be a non-negative integer", key));
    return v;
  };
  if (const auto lo = count("minProperties"); lo && *lo > required.size())
    unsupported(d, "minProperties", fmt::format("\"minProperties\": {} is more than the {} required properties; only "
                                                "what \"required\" already ensures is supported", *lo, required.size()));
  if (const auto hi = count("maxProperties"); hi && (additional != kNoNode || *hi < properties.size()))
    unsupported(d, "maxProperties", fmt::format("\"maxProperties\": {} is supported only where \"additionalProperties\" "
                                                "is false and at most that many properties are declared", *hi));
  check_budget(d, "properties");
  return g_.object(ObjectSyntax::kJson, std::move(properties), additional, forbid(d.safe), std::move(forbidden), free_key);
}

// propertyNames as an automaton over the key's text: a string schema's pattern, format,
// lengths, enum / const, through $refs (nullopt: it says nothing of strings).
std::optional<ByteDfa> SchemaCompiler::name_automaton(Doc& d, const Json& n) {
  PathGuard guard(d.path, "propertyNames");
  const Json& s = follow_refs(d.root, n);
  if (s.is_boolean()) {
    if (s.get<bool>()) return std::nullopt;
    return ByteDfa{};  // no name at all
  }
  if (!s.is_object()) d.error("", "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items())
    if (is_assertion(key) && key != "pattern" && key != "format" && key != "minLength" && key != "maxLength" &&
        key != "enum" && key != "const" && !(key == "type" && value == Json("string"))) {
      unsupported(d, key, fmt::format("\"propertyNames\" with \"{}\" is not supported (pattern, format, lengths and "
                                      "string constants are)", key));
      return std::nullopt;
    }
  std::optional<ByteDfa> dfa = text_automaton(d, s);
  if (s.contains("enum") || s.contains("const")) {
    std::vector<std::string> texts;
    for (const Json& v : s.contains("enum") && s["enum"].is_array() ? s["enum"] : Json::array({s.value("const", Json())}))
      if (v.is_string()) texts.push_back(v.get<std::string>());
    const ByteDfa listed = literal_set_dfa(texts);
    dfa = dfa ? intersect(*dfa, listed, automaton_budget(d, "enum")) : listed;
  }
  const auto [lo, hi] = string_lengths(d, s);
  if (lo > 0 || hi != kUnbounded) dfa = bound_length(dfa ? *dfa : regex_dfa(""), lo, hi, automaton_budget(d, "maxLength"));
  if (dfa) automaton_states_ += dfa->size();
  return dfa;
}

// contains (minContains, maxContains): the first minContains items meet both items and
// contains, the rest meet items (and, under maxContains, not contains): always valid.
NodeId SchemaCompiler::compile_contains(Doc& d, const Json& s, size_t depth) {
  Json plain = s;
  for (const char* k : {"contains", "minContains", "maxContains"}) plain.erase(k);
  if (s.contains("prefixItems") || (s.contains("items") && s["items"].is_array())) {
    unsupported(d, "contains", "\"contains\" beside a tuple (prefixItems, items as a list) is not supported");
    return compile_array(d, plain, depth);
  }
  auto count = [&](const char* key, uint64_t fallback) {
    if (!s.contains(key)) return fallback;
    const std::optional<uint64_t> v = count_value(s[key]);
    if (!v) d.error(key, fmt::format("\"{}\" must be a non-negative integer", key));
    return *v;
  };
  const uint64_t least = count("minContains", 1);
  const std::optional<uint64_t> most = s.contains("maxContains") ? std::optional<uint64_t>(count("maxContains", 0)) : std::nullopt;
  if (most && least > *most) d.error("minContains", "\"minContains\" is larger than \"maxContains\"");
  if (const auto max_items = s.contains("maxItems") ? count_value(s["maxItems"]) : std::nullopt; max_items && *max_items < least)
    d.error("minContains", fmt::format("{} items must meet \"contains\", but \"maxItems\" is {}", least, *max_items));
  if (least > 64) {
    unsupported(d, "minContains", fmt::format("\"minContains\": {}: at most 64 are supported", least));
    return compile_array(d, plain, depth);
  }
  const Json item = s.contains("items") ? s["items"] : Json(true);
  const Json& wanted = s["contains"];
  plain["items"] = most ? Json{{"allOf", Json::array({item, Json{{"not", wanted}}})}} : item;
  if (least > 0) plain["prefixItems"] = Json::array();
  for (uint64_t i = 0; i < least; ++i) plain["prefixItems"].push_back(Json{{"allOf", Json::array({item, wanted})}});
  PathGuard guard(d.path, "contains");
  return compile_array(d, plain, depth);
}

NodeId SchemaCompiler::compile_array(Doc& d, const Json& s, size_t depth) {
  if (s.contains("contains")) return compile_contains(d, s, depth);
  auto bound = [&](const char* key, uint32_t fallback) {
    if (!s.contains(key)) return fallback;
    const std::optional<uint64_t> x = count_value(s[key]);
    if (!x) d.error(key, fmt::format("\"{}\" must be a non-negative integer", key));
    return static_cast<uint32_t>(std::min<uint64_t>(*x, kUnbounded - 1));
  };
  const uint32_t lo = bound("minItems", 0), hi = bound("maxItems", kUnbounded);
  if (lo > hi) d.error("minItems", "\"minItems\" is larger than \"maxItems\": no array can satisfy both");
  // Tuples: prefixItems (2020-12) or items as a list (drafts 4 to 2019-09); the items after
  // them follow items / additionalItems.
  const char* prefix_key = nullptr;
  const char* rest_key = "items";
  if (s.contains("prefixItems")) {
    prefix_key = "prefixItems";
    if (!s["prefixItems"].is_array()) d.error("prefixItems", "\"prefixItems\" must be an array of schemas");
    if (s.contains("items") && s["items"].is_array()) d.error("items", "\"items\" cannot be a list beside \"prefixItems\"");
  } else if (s.contains("items") && s["items"].is_array()) {
    prefix_key = "items";
    rest_key = "additionalItems";
  }
  if (prefix_key && !s[prefix_key].empty()) return compile_tuple(d, s, prefix_key, rest_key, lo, hi, depth);
  NodeId item;
  ++d.containers;
  if (s.contains(rest_key)) {
    const Json& it = s[rest_key];
    if (it.is_boolean() && !it.get<bool>()) {
      --d.containers;
      if (lo > 0) d.error(rest_key, fmt::format("\"{}\" is false but \"minItems\" is above 0: no array can satisfy both", rest_key));
      return g_.literal({g_.symbols("[]")}, {"[]"});
    }
    PathGuard guard(d.path, rest_key);
    item = compile_schema(d, it, depth + 1);
  } else {
    item = any_value(d.safe);
  }
  --d.containers;
  return g_.array(item, lo, hi);
}

// "[" p0 "," p1 … then the rest's items "," r … "]": every listed item is written (unless
// maxItems stops it earlier), the rest as minItems / maxItems leave room. Separators are ","
// or ", "; no other whitespace.
NodeId SchemaCompiler::compile_tuple(Doc& d, const Json& s, const char* prefix_key, const char* rest_key, uint32_t lo,
                                     uint32_t hi, size_t depth) {
  const Json& prefix = s[prefix_key];
  ++d.containers;
  const NodeId sep = g_.literal({g_.symbols(","), g_.symbols(", ")}, {});
  std::vector<NodeId> parts = {g_.literal_text("[")};
  uint32_t written = 0;
  {
    PathGuard guard(d.path, prefix_key);
    for (; written < prefix.size() && written < hi; ++written) {
      PathGuard index(d.path, fmt::format("[{}]", written));
      const Json& item = prefix[written];
      if (item == Json(false)) {  // no array reaches this position
        if (written < lo) d.error("", fmt::format("item {} is false but \"minItems\" is {}", written, lo));
        hi = written;
        break;
      }
      if (written > 0) parts.push_back(sep);
      parts.push_back(compile_schema(d, item, depth + 1));
    }
  }
  const bool all_listed = written == prefix.size();
  uint32_t rest_min = lo > written ? lo - written : 0;
  uint32_t rest_max = !all_listed ? 0 : hi == kUnbounded ? kUnbounded : hi - written;
  const bool rest_false = s.contains(rest_key) && s[rest_key] == Json(false);
  if (rest_false) rest_max = 0;
  if (rest_min > rest_max)
    d.error(rest_false ? rest_key : "minItems",
            fmt::format("\"minItems\" is {}, but only {} items can be written", lo, written));
  if (rest_max > 0) {
    NodeId rest;
    if (s.contains(rest_key)) {
      PathGuard guard(d.path, rest_key);
      rest = compile_schema(d, s[rest_key], depth + 1);
    } else {
      rest = any_value(d.safe);
    }
    parts.push_back(g_.repeat(g_.seq({sep, rest}), kNoNode, rest_min, rest_max));
  }
  parts.push_back(g_.literal_text("]"));
  --d.containers;
  check_budget(d, prefix_key);
  return g_.seq(std::move(parts));
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
NodeId SchemaCompiler::compile_number(Doc& d, const Json& s, bool integer, const std::vector<Json>& excluded) {
  // multipleOf k (a whole k): integers only, through an automaton of remainders.
  uint64_t multiple = 1;
  if (s.contains("multipleOf")) {
    const Json& m = s["multipleOf"];
    if (!m.is_number() || !(m.get<double>() > 0)) d.error("multipleOf", "\"multipleOf\" must be a number above 0");
    const double k = m.get<double>();
    if (std::floor(k) != k || k > 1e15)
      unsupported(d, "multipleOf", fmt::format("\"multipleOf\": {}: only whole numbers up to 10^15 are supported", m.dump()));
    else
      multiple = static_cast<uint64_t>(k), integer = true;  // a number that is a multiple of k: an integer one
  }
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
  if (!lo.set && !hi.set) return bounded_number(d, std::nullopt, multiple, integer, excluded);
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
  if (!lo.set && !hi.set) return bounded_number(d, std::nullopt, multiple, integer, excluded);
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
  ByteDfa bounds = regex_dfa("^(?:" + alts + ")$", automaton_budget(d, lo.set ? lo.keyword : hi.keyword));
  automaton_states_ += bounds.size();
  return bounded_number(d, std::move(bounds), multiple, integer, excluded);
}

namespace {

// The texts of the numbers `values` (with their trailing-zero and "-0" spellings), as a
// pattern; empty when a value has an exponent or is outside what is generated.
std::string number_texts(const std::vector<Json>& values, bool integer) {
  std::string alts;
  for (const Json& v : values) {
    std::string t = v.dump();
    if (t.find_first_of("eE") != std::string::npos) return "";
    if (integer && t.find('.') != std::string::npos) {
      const double x = v.get<double>();
      if (std::floor(x) != x) continue;  // no integer has this value
      t = t.substr(0, t.find('.'));
    }
    const bool zero = std::strtod(t.c_str(), nullptr) == 0;
    if (zero) t = "-?" + (t[0] == '-' ? t.substr(1) : t);
    std::string p;
    for (char c : t) p += c == '.' ? std::string("\\.") : std::string(1, c);
    if (!integer) p += t.find('.') == std::string::npos ? "(?:\\.0+)?" : "0*";
    alts += (alts.empty() ? "" : "|") + p;
  }
  return alts.empty() ? "(?!)" : alts;
}

}  // namespace

// A number node from its bounds' automaton, a multipleOf (1: none) and the values "not" excludes.
NodeId SchemaCompiler::bounded_number(Doc& d, std::optional<ByteDfa> bounds, uint64_t multiple, bool integer,
                                      const std::vector<Json>& excluded) {
  if (multiple > 1) {
    try {
      ByteDfa multiples = multiples_dfa(multiple, kMaxIntDigits, automaton_budget(d, "multipleOf"));
      automaton_states_ += multiples.size();
      if (bounds) {
        bounds = intersect(*bounds, multiples, automaton_budget(d, "multipleOf"));
        automaton_states_ += bounds->size();
      } else {
        bounds = std::move(multiples);
      }
    } catch (const SchemaError&) {
      throw;
    } catch (const Error& e) {
      unsupported(d, "multipleOf", e.what());
      if (!bounds) return g_.number(true);
    }
    if (bounds->start == ByteDfa::kDead)
      d.error("multipleOf", fmt::format("no integer within the bounds is a multiple of {}", multiple));
  }
  if (!excluded.empty()) {
    const std::string texts = number_texts(excluded, integer || multiple > 1);
    if (texts.empty()) {
      unsupported(d, "not", "\"not\" of a number written with an exponent is not supported");
    } else if (texts != "(?!)") {
      try {
        // Without an exponent, a number has one spelling up to trailing zeros.
        if (!bounds)
          bounds = regex_dfa(integer ? "^-?(?:0|[1-9]\\d{0,14})$" : "^-?(?:0|[1-9]\\d{0,14})(?:\\.\\d{1,15})?$");
        bounds = subtract(*bounds, regex_dfa("^(?:" + texts + ")$"), automaton_budget(d, "not"));
        automaton_states_ += bounds->size();
      } catch (const SchemaError&) {
        throw;
      } catch (const Error& e) {
        unsupported(d, "not", e.what());
      }
      if (bounds && bounds->start == ByteDfa::kDead) d.error("not", "\"not\" excludes every number the schema allows");
    }
  }
  if (!bounds) return g_.number(integer);
  return g_.pattern_number(*bounds);
}

std::pair<uint32_t, uint32_t> SchemaCompiler::string_lengths(Doc& d, const Json& s) {
  auto bound = [&](const char* key, uint32_t fallback) {
    if (!s.contains(key)) return fallback;
    const std::optional<uint64_t> x = count_value(s[key]);
    if (!x) d.error(key, fmt::format("\"{}\" must be a non-negative integer", key));
    return static_cast<uint32_t>(std::min<uint64_t>(*x, kUnbounded - 1));
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

NodeId SchemaCompiler::compile_string(Doc& d, const Json& s, const std::vector<std::string>& excluded) {
  const auto [lo, hi] = string_lengths(d, s);
  std::optional<ByteDfa> dfa = text_automaton(d, s);
  if (!excluded.empty()) {
    try {
      const ByteDfa any = dfa ? *dfa : regex_dfa("");
      dfa = subtract(any, literal_set_dfa(excluded), automaton_budget(d, "not"));
      automaton_states_ += dfa->size();
    } catch (const SchemaError&) {
      throw;
    } catch (const Error& e) {
      unsupported(d, "not", e.what());
    }
    if (dfa && dfa->start == ByteDfa::kDead) d.error("not", "\"not\" excludes every string the schema allows");
  }
  if (!dfa) return g_.string(lo, hi, forbid(d.safe));
  // Pattern and format: one automaton, the lengths and (inside DSML) the marker folded in.
  ByteDfa text = *dfa;
  const std::string keyword = s.contains("pattern") ? "pattern" : s.contains("format") ? "format" : "not";
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
