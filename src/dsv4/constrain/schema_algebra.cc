#include "dsv4/constrain/schema_algebra.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "dsv4/constrain/json_schema.h"
#include "dsv4/constrain/regex.h"

namespace dsv4::constrain {

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

namespace {

// The target of a local "$ref" (nullptr: not one this document has).
const Json* ref_target(const Json& root, const Json& ref) {
  if (!ref.is_string()) return nullptr;
  const std::string r = ref.get<std::string>();
  if (r.empty() || r[0] != '#') return nullptr;
  try {
    const Json::json_pointer p(percent_decode(r.substr(1)));
    return root.contains(p) ? &root.at(p) : nullptr;
  } catch (const Json::exception&) {
    return nullptr;
  }
}

}  // namespace

const Json& follow_refs(const Json& root, const Json& s) {
  const Json* at = &s;
  for (int hop = 0; hop < 16 && at->is_object() && at->contains("$ref"); ++hop) {
    const Json* next = ref_target(root, (*at)["$ref"]);
    if (!next) break;
    at = next;
  }
  return *at;
}

std::vector<std::string> implied_types(const Json& s) {
  auto has = [&](std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      if (s.contains(k)) return true;
    return false;
  };
  std::vector<std::string> out;
  if (has({"properties", "required", "additionalProperties", "minProperties", "maxProperties", "patternProperties",
           "propertyNames"}))
    out.push_back("object");
  if (has({"items", "minItems", "maxItems", "prefixItems", "contains"})) out.push_back("array");
  if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) out.push_back("number");
  if (has({"minLength", "maxLength", "pattern"}) ||
      (s.contains("format") && s["format"].is_string() && known_format(s["format"].get<std::string>())))
    out.push_back("string");
  return out;
}

bool asserts_nothing(const Json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (!s.is_object()) return false;
  for (const auto& [key, value] : s.items())
    if (is_assertion(key) && key != "$defs" && key != "definitions" && key != "$id" &&
        !(key == "uniqueItems" && value == Json(false)))
      return false;
  return true;
}

namespace {

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
  const std::vector<std::string> implied = implied_types(s);
  return implied.empty() ? all : std::set<std::string>(implied.begin(), implied.end());
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

}  // namespace

bool fails_other(const Json& root, const Json& a_in, const Json& b_in) {
  const Json& a = follow_refs(root, a_in);
  const Json& b = follow_refs(root, b_in);
  if (b.is_boolean()) return !b.get<bool>();
  if (a.is_boolean()) return !a.get<bool>();
  if (!types_overlap(admitted_types(a, true), admitted_types(b, false))) return true;
  const auto va = listed_values(a), vb = listed_values(b);
  if (va && vb) return values_disjoint(*va, *vb);
  if (!a.is_object() || !b.is_object()) return false;
  // A closed object (additionalProperties false) never has a name it does not declare: it
  // fails a schema that requires one (only objects; "a" generates objects only then).
  auto declares = [](const Json& s, const std::string& name) {
    return s.contains("properties") && s["properties"].is_object() && s["properties"].contains(name) &&
           s["properties"][name] != Json(false);
  };
  auto closed = [](const Json& s) { return s.contains("additionalProperties") && s["additionalProperties"] == Json(false); };
  const bool a_objects = admitted_types(a, true) == std::set<std::string>{"object"};
  if (a_objects && b.contains("required") && b["required"].is_array()) {
    for (const Json& name : b["required"])
      if (name.is_string() && closed(a) && !declares(a, name.get<std::string>()) &&
          !(a.contains("patternProperties")))
        return true;
  }
  if (a_objects && a.contains("required") && a["required"].is_array() && closed(b) && !b.contains("patternProperties")) {
    for (const Json& name : a["required"])
      if (name.is_string() && !declares(b, name.get<std::string>())) return true;  // b forbids what a always writes
  }
  if (!a.contains("required") || !a["required"].is_array() || !a.contains("properties") || !b.contains("properties") ||
      !a["properties"].is_object() || !b["properties"].is_object())
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

// ---- rewriting ---------------------------------------------------------------------------

namespace {

bool enforced_sibling(const std::string& key, const Json& value) {
  return is_assertion(key) && key != "$defs" && key != "definitions" && key != "$id" &&
         !(key == "uniqueItems" && value == Json(false));
}

}  // namespace

bool simple_exclusion(const Json& n) {
  if (n.is_boolean()) return true;
  if (!n.is_object()) return false;
  int keys = 0;
  for (const auto& [key, value] : n.items()) {
    if (!enforced_sibling(key, value)) continue;
    ++keys;
    if (key == "anyOf") {
      if (!value.is_array()) return false;
      for (const Json& alt : value)
        if (!simple_exclusion(alt)) return false;
    } else if (key != "type" && key != "const" && key != "enum") {
      return false;
    }
  }
  return keys <= 1;
}

void collect_exclusion(const Json& n, std::vector<std::string>& types, std::vector<Json>& values) {
  if (asserts_nothing(n)) {  // not {} / not true: every value
    types = type_names();
    return;
  }
  if (!n.is_object()) return;
  if (n.contains("type")) {
    const Json& t = n["type"];
    for (const Json& name : t.is_array() ? t : Json::array({t}))
      if (name.is_string()) types.push_back(name.get<std::string>());
  }
  if (n.contains("const")) values.push_back(n["const"]);
  if (n.contains("enum") && n["enum"].is_array())
    for (const Json& v : n["enum"]) values.push_back(v);
  if (n.contains("anyOf") && n["anyOf"].is_array())
    for (const Json& alt : n["anyOf"]) collect_exclusion(alt, types, values);
}

bool needs_merge(const Json& s) {
  if (!s.is_object()) return false;
  for (const char* key : {"allOf", "unevaluatedProperties", "if", "dependentRequired", "dependentSchemas", "dependencies"})
    if (s.contains(key)) return true;
  if (s.contains("not") && !simple_exclusion(s["not"])) return true;
  int applicators = 0, others = 0;
  for (const auto& [key, value] : s.items()) {
    if (key == "$ref" || key == "anyOf" || key == "oneOf") ++applicators;
    else if (enforced_sibling(key, value)) ++others;
  }
  return applicators > 1 || (applicators == 1 && others > 0);
}

const Json* sole_part(const Json& s) {
  if (!s.is_object() || !s.contains("allOf") || !s["allOf"].is_array() || s["allOf"].empty()) return nullptr;
  for (const auto& [key, value] : s.items())
    if (key != "allOf" && enforced_sibling(key, value)) return nullptr;
  const Json* sole = nullptr;
  for (const Json& part : s["allOf"]) {
    if (asserts_nothing(part)) continue;
    if (sole) return nullptr;
    sole = &part;
  }
  return sole ? sole : &s["allOf"][0];
}

namespace {

size_t json_values(const Json& j, size_t cap) {
  size_t n = 1;
  if (j.is_structured())
    for (const Json& child : j) {
      if (n >= cap) break;
      n += json_values(child, cap - n);
    }
  return n;
}

// One alternative on the way, with the oneOf branches it took (oneOf id, branch).
struct Alternative {
  Json schema;
  std::vector<std::pair<uint32_t, uint32_t>> branches;
  // What a "not" (or an "if" that failed) adds: merged only at the end, after every
  // unevaluatedProperties has been applied, because what a negation declares evaluates nothing.
  Json late = Json::object();
};

// Alternatives whose constraints all come late.
std::vector<Alternative> as_late(std::vector<Alternative> alts) {
  for (Alternative& a : alts) {
    a.late = std::move(a.schema);
    a.schema = Json::object();
  }
  return alts;
}

class Rewriter {
 public:
  explicit Rewriter(MergeContext& c) : c_(c) {}

  std::vector<Alternative> expand(const Json& s, int depth);
  // The values `n` does not admit, as alternatives (`keyword`: "not" or "if", for messages).
  std::vector<Alternative> negate(const Json& n, int depth, const char* keyword);
  void check_one_ofs(const std::vector<Alternative>& alts);
  // Each alternative with its late part merged in (those that cannot hold left out).
  std::vector<Alternative> fold_late(std::vector<Alternative> alts) {
    std::vector<Alternative> out;
    for (Alternative& a : alts) {
      if (a.late.empty()) {
        out.push_back(std::move(a));
        continue;
      }
      std::optional<Json> m = merge(a.schema, a.late);
      if (!m) continue;
      out.push_back(Alternative{std::move(*m), std::move(a.branches), Json::object()});
    }
    return out;
  }

 private:
  std::vector<Alternative> combine(const std::vector<Alternative>& a, const std::vector<Alternative>& b);
  std::optional<Json> merge(const Json& a, const Json& b);
  void merge_properties(const Json& a, const Json& b, Json& m);
  void merge_items(const Json& a, const Json& b, Json& m);
  void spend(const Json& j) {
    const size_t n = json_values(j, c_.values_left + 1);
    if (n > c_.values_left) c_.error("allOf", "the schema's allOf / anyOf combinations are too large to merge");
    c_.values_left -= n;
  }

  // What `side` says of a name it does not declare: the schemas of its patternProperties that
  // match it, else its additionalProperties (`extra`).
  Json undeclared(const Json& side, const Json& extra, const std::string& name);

  MergeContext& c_;
  uint32_t one_ofs_ = 0;  // oneOfs met so far (their ids)
  std::map<std::string, ByteDfa> patterns_;  // patternProperties' automata, by pattern
};

// Draft 4's boolean exclusiveMinimum / exclusiveMaximum in the 2020-12 form.
void normalize_bounds(Json& s) {
  for (const auto& [excl, incl] : {std::pair<const char*, const char*>{"exclusiveMinimum", "minimum"},
                                   {"exclusiveMaximum", "maximum"}}) {
    if (!s.contains(excl) || !s[excl].is_boolean()) continue;
    const bool on = s[excl].get<bool>();
    s.erase(excl);
    if (on && s.contains(incl)) {
      s[excl] = s[incl];
      s.erase(incl);
    }
  }
}

std::vector<Alternative> Rewriter::expand(const Json& s, int depth) {
  if (depth > 32) c_.error("allOf", "allOf / $ref nest more than 32 levels deep (a reference that never ends?)");
  if (s.is_boolean()) {
    if (s.get<bool>()) return {Alternative{Json::object(), {}}};
    return {};
  }
  if (!s.is_object()) c_.error("allOf", "a schema must be an object or a boolean");
  Json rest = Json::object();
  for (const auto& [key, value] : s.items())
    if (key != "allOf" && key != "anyOf" && key != "oneOf" && key != "$ref" && key != "$defs" &&
        key != "definitions" && key != "$id" && key != "$schema" && key != "unevaluatedProperties" &&
        key != "if" && key != "then" && key != "else" && key != "dependentRequired" && key != "dependentSchemas" &&
        key != "dependencies" && !(key == "not" && !simple_exclusion(value)))
      rest[key] = value;
  normalize_bounds(rest);
  spend(rest);
  // Properties are written in the order they are met: a base's ($ref, allOf) first, then the
  // holder's own, then what alternatives add.
  std::vector<Alternative> acc = {Alternative{Json::object(), {}}};

  if (s.contains("$ref")) {
    const Json* target = ref_target(c_.root, s["$ref"]);
    if (!target)
      c_.error("$ref", fmt::format("\"{}\" does not name a part of this schema", s["$ref"].dump()));
    acc = combine(acc, expand(*target, depth + 1));
  }
  if (s.contains("allOf")) {
    const Json& parts = s["allOf"];
    if (!parts.is_array() || parts.empty()) c_.error("allOf", "\"allOf\" must be a non-empty array");
    for (const Json& part : parts) acc = combine(acc, expand(part, depth + 1));
  }
  acc = combine(acc, {Alternative{std::move(rest), {}}});
  if (s.contains("anyOf")) {
    const Json& alts = s["anyOf"];
    if (!alts.is_array() || alts.empty()) c_.error("anyOf", "\"anyOf\" must be a non-empty array");
    std::vector<Alternative> all;
    for (const Json& alt : alts)
      for (Alternative& a : expand(alt, depth + 1)) all.push_back(std::move(a));
    acc = combine(acc, all);
  }
  if (s.contains("oneOf")) {
    const Json& alts = s["oneOf"];
    if (!alts.is_array() || alts.empty()) c_.error("oneOf", "\"oneOf\" must be a non-empty array");
    const uint32_t id = one_ofs_++;
    std::vector<Alternative> all;
    for (size_t i = 0; i < alts.size(); ++i)
      for (Alternative& a : expand(alts[i], depth + 1)) {
        a.branches.emplace_back(id, static_cast<uint32_t>(i));
        all.push_back(std::move(a));
      }
    acc = combine(acc, all);
  }
  if (s.contains("not") && !simple_exclusion(s["not"])) acc = combine(acc, as_late(negate(s["not"], depth + 1, "not")));
  if (s.contains("if")) {
    // Exclusive branches: the condition and "then", or its negation and "else".
    const Json yes = s.contains("then") ? s["then"] : Json(true), no = s.contains("else") ? s["else"] : Json(true);
    std::vector<Alternative> branches = combine(expand(s["if"], depth + 1), expand(yes, depth + 1));
    for (Alternative& a : combine(as_late(negate(s["if"], depth + 1, "if")), expand(no, depth + 1)))
      branches.push_back(std::move(a));
    acc = combine(acc, branches);
  }
  // A dependency holds when its name is absent, or when the names / schema it asks for hold too.
  auto depend = [&](const std::string& name, const Json& on, const char* keyword) {
    std::vector<Alternative> either = {Alternative{Json{{"properties", Json{{name, false}}}}, {}}};
    Json present = Json{{"required", Json::array({name})}};
    if (on.is_array()) {
      for (const Json& other : on) {
        if (!other.is_string()) c_.error(keyword, fmt::format("\"{}\" lists names: strings", keyword));
        present["required"].push_back(other);
      }
      either.push_back(Alternative{std::move(present), {}});
    } else {
      for (Alternative& a : combine({Alternative{std::move(present), {}}}, expand(on, depth + 1))) either.push_back(std::move(a));
    }
    acc = combine(acc, either);
  };
  for (const char* keyword : {"dependentRequired", "dependentSchemas", "dependencies"}) {
    if (!s.contains(keyword)) continue;
    const Json& deps = s[keyword];
    if (!deps.is_object()) c_.error(keyword, fmt::format("\"{}\" must be an object", keyword));
    for (const auto& [name, on] : deps.items()) {
      if (std::string_view(keyword) == "dependentRequired" && !on.is_array())
        c_.error(keyword, "\"dependentRequired\" maps names to arrays of names");
      if (std::string_view(keyword) == "dependentSchemas" && on.is_array())
        c_.error(keyword, "\"dependentSchemas\" maps names to schemas");
      depend(name, on, keyword);
    }
  }
  if (s.contains("unevaluatedProperties")) {
    // What no part evaluated: with the parts merged, the names outside every "properties",
    // unless some part's additionalProperties already evaluated them.
    const Json& u = s["unevaluatedProperties"];
    if (!u.is_boolean() && !u.is_object())
      c_.error("unevaluatedProperties", "\"unevaluatedProperties\" must be a boolean or a schema");
    for (Alternative& a : acc)
      if (!a.schema.contains("additionalProperties")) a.schema["additionalProperties"] = u;
  }
  return acc;
}

std::vector<Alternative> Rewriter::negate(const Json& n_in, int depth, const char* keyword) {
  if (depth > 32) c_.error(keyword, fmt::format("\"{}\" nests more than 32 levels deep", keyword));
  if (n_in.is_boolean()) {
    if (n_in.get<bool>()) return {};
    return {Alternative{Json::object(), {}}};
  }
  if (!n_in.is_object()) c_.error(keyword, fmt::format("\"{}\" must be a schema", keyword));
  if (simple_exclusion(n_in)) return {Alternative{Json{{"not", n_in}}, {}}};
  Json n = n_in;
  normalize_bounds(n);
  std::vector<Alternative> out;
  auto add = [&](Json j) {
    for (const Alternative& a : out)
      if (a.schema == j) return;
    spend(j);
    out.push_back(Alternative{std::move(j), {}});
  };
  auto add_all = [&](std::vector<Alternative> alts) {
    for (Alternative& a : alts) add(std::move(a.schema));
  };
  // A keyword that asserts only on one type fails for the others, or for that type inside.
  auto scoped = [&](const char* type, Json inside) {
    add(Json{{"not", Json{{"type", type}}}});
    inside["type"] = type;
    add(std::move(inside));
  };
  // De Morgan: the schema fails when one of its keywords fails.
  for (const auto& [key, v] : n.items()) {
    if (!enforced_sibling(key, v)) continue;
    if (key == "type" || key == "const" || key == "enum") {
      add(Json{{"not", Json{{key, v}}}});
    } else if (key == "not") {
      add_all(expand(v, depth + 1));  // not not X: X
    } else if (key == "$ref") {
      const Json* target = ref_target(c_.root, v);
      if (!target) c_.error("$ref", fmt::format("\"{}\" does not name a part of this schema", v.dump()));
      add_all(negate(*target, depth + 1, keyword));
    } else if (key == "anyOf" && v.is_array()) {
      std::vector<Alternative> none = {Alternative{Json::object(), {}}};
      for (const Json& alt : v) none = combine(none, negate(alt, depth + 1, keyword));
      add_all(std::move(none));
    } else if (key == "allOf" && v.is_array()) {
      for (const Json& part : v) add_all(negate(part, depth + 1, keyword));
    } else if (key == "required" && v.is_array()) {
      for (const Json& name : v)
        if (name.is_string()) scoped("object", Json{{"properties", Json{{name.get<std::string>(), false}}}});
    } else if (key == "properties" && v.is_object()) {
      for (const auto& [name, schema] : v.items())
        for (Alternative& a : negate(schema, depth + 1, keyword))
          scoped("object", Json{{"required", Json::array({name})}, {"properties", Json{{name, std::move(a.schema)}}}});
    } else if ((key == "minimum" || key == "exclusiveMinimum" || key == "maximum" || key == "exclusiveMaximum") &&
               v.is_number()) {
      const char* opposite = key == "minimum" ? "exclusiveMaximum" : key == "exclusiveMinimum" ? "maximum"
                             : key == "maximum" ? "exclusiveMinimum" : "minimum";
      scoped("number", Json{{opposite, v}});
    } else if (key == "contains" && !n.contains("minContains") && !n.contains("maxContains")) {
      scoped("array", Json{{"items", Json{{"not", v}}}});  // no item meets it
    } else if ((key == "minLength" || key == "minItems") && v.is_number_unsigned()) {
      if (v.get<uint64_t>() > 0)
        scoped(key == "minLength" ? "string" : "array", Json{{key == "minLength" ? "maxLength" : "maxItems", v.get<uint64_t>() - 1}});
    } else if ((key == "maxLength" || key == "maxItems") && v.is_number_unsigned()) {
      scoped(key == "maxLength" ? "string" : "array", Json{{key == "maxLength" ? "minLength" : "minItems", v.get<uint64_t>() + 1}});
    } else {
      c_.unsupported(keyword, fmt::format("\"{}\" of a schema with \"{}\" cannot be enforced", keyword, key));
      return {Alternative{Json::object(), {}}};  // not strict: the negation is dropped, as refused keywords are
    }
  }
  return out;
}

std::vector<Alternative> Rewriter::combine(const std::vector<Alternative>& a, const std::vector<Alternative>& b) {
  std::vector<Alternative> out;
  for (const Alternative& x : a)
    for (const Alternative& y : b) {
      std::optional<Json> m = merge(x.schema, y.schema);
      if (!m) continue;  // these two cannot both hold
      std::optional<Json> late = x.late.empty() ? std::optional<Json>(y.late) : y.late.empty() ? std::optional<Json>(x.late)
                                                                                               : merge(x.late, y.late);
      if (!late) continue;
      if (out.size() >= c_.max_alternatives)
        c_.error("allOf", fmt::format("the combination of allOf / anyOf / oneOf gives more than {} alternatives",
                                      c_.max_alternatives));
      spend(*m);
      spend(*late);
      Alternative z{std::move(*m), x.branches, std::move(*late)};
      z.branches.insert(z.branches.end(), y.branches.begin(), y.branches.end());
      out.push_back(std::move(z));
    }
  return out;
}

std::set<std::string> type_set(const Json& t) {
  std::set<std::string> out;
  if (t.is_string()) out.insert(t.get<std::string>());
  else if (t.is_array())
    for (const Json& x : t)
      if (x.is_string()) out.insert(x.get<std::string>());
  return out;
}

bool lowers(const std::string& key) {
  return key == "minLength" || key == "minItems" || key == "minimum" || key == "exclusiveMinimum" ||
         key == "minProperties" || key == "minContains";
}
bool uppers(const std::string& key) {
  return key == "maxLength" || key == "maxItems" || key == "maximum" || key == "exclusiveMaximum" ||
         key == "maxProperties" || key == "maxContains";
}

std::optional<Json> Rewriter::merge(const Json& a, const Json& b) {
  Json m = a;
  for (const auto& [key, vb] : b.items()) {
    if (key == "properties" || key == "additionalProperties" || key == "enum" || key == "const") continue;
    const bool tuple = a.contains("prefixItems") || b.contains("prefixItems") || (a.contains("items") && a["items"].is_array()) ||
                       (b.contains("items") && b["items"].is_array());
    if (tuple && (key == "items" || key == "prefixItems" || key == "additionalItems")) continue;  // merge_items
    if (!m.contains(key)) {
      m[key] = vb;
      continue;
    }
    Json& va = m[key];
    if (va == vb || !is_assertion(key)) continue;  // annotations: the first part's stay
    if (key == "type") {
      const std::set<std::string> ta = type_set(va), tb = type_set(vb);
      auto admits = [](const std::set<std::string>& ts, const std::string& t) {
        return ts.count(t) || (t == "integer" && ts.count("number"));
      };
      std::vector<std::string> both;
      for (const std::string& t : type_names())
        if (admits(ta, t) && admits(tb, t)) both.push_back(t);
      if (both.empty()) return std::nullopt;
      if (std::find(both.begin(), both.end(), "number") != both.end()) std::erase(both, std::string("integer"));
      va = both.size() == 1 ? Json(both[0]) : Json(both);
    } else if (key == "required") {
      if (!va.is_array() || !vb.is_array()) c_.error("required", "\"required\" must be an array of property names");
      for (const Json& name : vb)
        if (std::find(va.begin(), va.end(), name) == va.end()) va.push_back(name);
    } else if (lowers(key) || uppers(key)) {
      if (!va.is_number() || !vb.is_number()) c_.error(key, fmt::format("\"{}\" must be a number", key));
      if (lowers(key) ? vb > va : vb < va) va = vb;
    } else if (key == "multipleOf") {
      if (!va.is_number_unsigned() || !vb.is_number_unsigned() || va.get<uint64_t>() == 0 || vb.get<uint64_t>() == 0) {
        c_.unsupported("allOf", "parts with different non-integer \"multipleOf\" cannot be merged");
        continue;
      }
      const uint64_t x = va.get<uint64_t>(), y = vb.get<uint64_t>(), g = std::gcd(x, y);
      if (x / g > (uint64_t{1} << 53) / y) c_.error("multipleOf", "the parts' \"multipleOf\" have no common multiple in range");
      va = x / g * y;
    } else if (key == "items" && !va.is_array() && !vb.is_array()) {
      va = Json{{"allOf", Json::array({va, vb})}};
    } else if (key == "format") {
      const bool ka = va.is_string() && known_format(va.get<std::string>());
      const bool kb = vb.is_string() && known_format(vb.get<std::string>());
      if (ka && kb) c_.unsupported("allOf", fmt::format("parts with different formats ({} and {}) cannot be merged", va.dump(), vb.dump()));
      else if (kb) va = vb;
    } else if (key == "uniqueItems") {
      va = va == Json(true) || vb == Json(true);
    } else if (key == "not") {
      va = Json{{"anyOf", Json::array({va, vb})}};  // not A and not B: not (A or B)
    } else {
      c_.unsupported("allOf", fmt::format("parts with different \"{}\" cannot be merged", key));
    }
  }
  // Constants: the values both allow.
  const auto la = listed_values(a), lb = listed_values(b);
  if (la || lb) {
    std::vector<Json> values;
    if (la && lb) {
      for (const Json& v : *la)
        if (std::find(lb->begin(), lb->end(), v) != lb->end()) values.push_back(v);
      if (values.empty()) return std::nullopt;
    } else {
      values = la ? *la : *lb;
    }
    m.erase("const");
    m["enum"] = values;
  }
  merge_items(a, b, m);
  merge_properties(a, b, m);
  // A simple "not" that excludes every type or constant left.
  if (m.contains("not") && simple_exclusion(m["not"])) {
    std::vector<std::string> types;
    std::vector<Json> values;
    collect_exclusion(m["not"], types, values);
    auto gone = [&](const std::string& t) {
      return std::find(types.begin(), types.end(), t) != types.end() ||
             (t == "integer" && std::find(types.begin(), types.end(), "number") != types.end());
    };
    if (m.contains("type")) {
      const std::set<std::string> left = type_set(m["type"]);
      if (!left.empty() && std::all_of(left.begin(), left.end(), gone)) return std::nullopt;
    }
    if (const auto listed = listed_values(m))
      if (std::all_of(listed->begin(), listed->end(), [&](const Json& v) {
            if (std::find(values.begin(), values.end(), v) != values.end()) return true;
            return std::any_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(v, t); });
          }))
        return std::nullopt;
  }
  // A required name that a part forbids: these parts cannot both hold.
  if (m.contains("required") && m["required"].is_array())
    for (const Json& name : m["required"]) {
      if (!name.is_string()) continue;
      const std::string key = name.get<std::string>();
      const bool declared = m.contains("properties") && m["properties"].is_object() && m["properties"].contains(key);
      if (declared ? m["properties"][key] == Json(false)
                   : m.contains("additionalProperties") && m["additionalProperties"] == Json(false))
        return std::nullopt;
    }
  return m;
}

// Items: position i meets what each side says of it (its prefixItems / list entry, else its
// schema for the rest), the rest meets both rests. Only tuples need this; plain items were
// merged as an allOf above.
void Rewriter::merge_items(const Json& a, const Json& b, Json& m) {
  auto prefix = [](const Json& s) -> const Json* {
    if (s.contains("prefixItems") && s["prefixItems"].is_array()) return &s["prefixItems"];
    if (s.contains("items") && s["items"].is_array()) return &s["items"];
    return nullptr;
  };
  auto rest = [](const Json& s) -> Json {
    if (s.contains("prefixItems")) return s.contains("items") ? s["items"] : Json(true);
    if (s.contains("items") && s["items"].is_array()) return s.contains("additionalItems") ? s["additionalItems"] : Json(true);
    return s.contains("items") ? s["items"] : Json(true);
  };
  const Json *pa = prefix(a), *pb = prefix(b);
  if (!pa && !pb) return;
  if (pa && pb && *pa == *pb && rest(a) == rest(b)) return;
  auto both = [](const Json& x, const Json& y) -> Json {
    if (asserts_nothing(x)) return y;
    if (asserts_nothing(y) || x == y) return x;
    return Json{{"allOf", Json::array({x, y})}};
  };
  const Json ra = rest(a), rb = rest(b);
  Json items = Json::array();
  const size_t n = std::max(pa ? pa->size() : 0, pb ? pb->size() : 0);
  for (size_t i = 0; i < n; ++i)
    items.push_back(both(pa && i < pa->size() ? (*pa)[i] : ra, pb && i < pb->size() ? (*pb)[i] : rb));
  for (const char* k : {"prefixItems", "items", "additionalItems"}) m.erase(k);
  m["prefixItems"] = std::move(items);
  m["items"] = both(ra, rb);
}

// Each name's schema is what both sides say of it: their "properties" entry, else their
// additionalProperties, else anything. A side that says false forbids the name.
void Rewriter::merge_properties(const Json& a, const Json& b, Json& m) {
  const bool any_props = a.contains("properties") || b.contains("properties");
  const bool any_extra = a.contains("additionalProperties") || b.contains("additionalProperties");
  if (!any_props && !any_extra) return;
  auto props = [&](const Json& s) -> const Json& {
    static const Json empty = Json::object();
    if (!s.contains("properties")) return empty;
    if (!s["properties"].is_object()) c_.error("properties", "\"properties\" must be an object");
    return s["properties"];
  };
  auto extra = [&](const Json& s) -> Json {
    return s.contains("additionalProperties") ? s["additionalProperties"] : Json(true);
  };
  auto both = [](const Json& x, const Json& y) -> Json {
    if (x == Json(false) || y == Json(false)) return false;
    if (asserts_nothing(x)) return y;
    if (asserts_nothing(y)) return x;
    if (x == y) return x;
    return Json{{"allOf", Json::array({x, y})}};
  };
  const Json &pa = props(a), &pb = props(b);
  const Json ea = extra(a), eb = extra(b);
  if ((a.contains("patternProperties") && !asserts_nothing(eb)) || (b.contains("patternProperties") && !asserts_nothing(ea)))
    c_.unsupported("allOf", "\"patternProperties\" in one part beside \"additionalProperties\" in another cannot be merged");
  Json merged = Json::object();
  for (const auto& [name, sa] : pa.items()) merged[name] = both(sa, pb.contains(name) ? pb[name] : undeclared(b, eb, name));
  for (const auto& [name, sb] : pb.items())
    if (!pa.contains(name)) merged[name] = both(undeclared(a, ea, name), sb);
  if (!merged.empty()) m["properties"] = std::move(merged);
  else m.erase("properties");
  if (any_extra) m["additionalProperties"] = both(ea, eb);
}

Json Rewriter::undeclared(const Json& side, const Json& extra, const std::string& name) {
  if (!side.contains("patternProperties") || !side["patternProperties"].is_object()) return extra;
  Json parts = Json::array();
  for (const auto& [pattern, schema] : side["patternProperties"].items()) {
    auto it = patterns_.find(pattern);
    if (it == patterns_.end()) {
      if (patterns_.size() >= 256) c_.error("patternProperties", "too many patterns to merge");
      try {
        it = patterns_.emplace(pattern, regex_dfa(pattern)).first;
      } catch (const Error& e) {
        c_.unsupported("patternProperties", fmt::format("\"patternProperties\" {}: {}", Json(pattern).dump(), e.what()));
        continue;
      }
    }
    if (full_match(it->second, name)) parts.push_back(schema);
  }
  if (parts.empty()) return extra;
  return parts.size() == 1 ? parts[0] : Json{{"allOf", std::move(parts)}};
}

// Exactly one branch of each oneOf holds when a value generated from an alternative that took
// branch i fails every alternative that took another branch of it.
void Rewriter::check_one_ofs(const std::vector<Alternative>& alts) {
  for (size_t i = 0; i < alts.size(); ++i)
    for (size_t j = i + 1; j < alts.size(); ++j)
      for (const auto& [id, branch] : alts[i].branches)
        for (const auto& [id2, branch2] : alts[j].branches)
          if (id == id2 && branch != branch2 &&
              (!fails_other(c_.root, alts[i].schema, alts[j].schema) ||
               !fails_other(c_.root, alts[j].schema, alts[i].schema))) {
            c_.unsupported("oneOf", fmt::format("\"oneOf\" alternatives {} and {} may both match one value, so "
                                                "\"exactly one\" cannot be enforced (give them different types, or a "
                                                "required property with different constants)",
                                                branch, branch2));
            return;
          }
}

}  // namespace

std::vector<Json> plain_alternatives(MergeContext& c, const Json& s) {
  Rewriter r(c);
  std::vector<Alternative> alts = r.fold_late(r.expand(s, 0));
  r.check_one_ofs(alts);
  std::vector<Json> out;
  for (Alternative& a : alts) out.push_back(std::move(a.schema));
  return out;
}

}  // namespace dsv4::constrain
