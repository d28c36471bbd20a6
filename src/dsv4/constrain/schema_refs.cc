#include "dsv4/constrain/schema_refs.h"

#include <map>
#include <string_view>
#include <vector>

namespace dsv4::constrain {
namespace {

// RFC 3986 appendix B: scheme ":" "//" authority path "?" query "#" fragment.
struct Uri {
  std::optional<std::string> scheme, authority, query, fragment;
  std::string path;
};

Uri parse_uri(std::string_view s) {
  Uri u;
  const size_t colon = s.find(':');
  const size_t first_delim = s.find_first_of("/?#");
  if (colon != std::string_view::npos && colon > 0 && (first_delim == std::string_view::npos || colon < first_delim)) {
    u.scheme = std::string(s.substr(0, colon));
    s.remove_prefix(colon + 1);
  }
  if (s.starts_with("//")) {
    s.remove_prefix(2);
    const size_t end = s.find_first_of("/?#");
    u.authority = std::string(s.substr(0, end));
    s.remove_prefix(end == std::string_view::npos ? s.size() : end);
  }
  const size_t hash = s.find('#');
  if (hash != std::string_view::npos) {
    u.fragment = std::string(s.substr(hash + 1));
    s = s.substr(0, hash);
  }
  const size_t question = s.find('?');
  if (question != std::string_view::npos) {
    u.query = std::string(s.substr(question + 1));
    s = s.substr(0, question);
  }
  u.path = std::string(s);
  return u;
}

// RFC 3986 section 5.2.4.
std::string remove_dot_segments(std::string in) {
  std::string out;
  while (!in.empty()) {
    if (in.starts_with("../")) in.erase(0, 3);
    else if (in.starts_with("./")) in.erase(0, 2);
    else if (in.starts_with("/./")) in.erase(0, 2);
    else if (in == "/.") in = "/";
    else if (in.starts_with("/../") || in == "/..") {
      in = in == "/.." ? "/" : in.substr(3);
      const size_t slash = out.rfind('/');
      out.erase(slash == std::string::npos ? 0 : slash);
    } else if (in == "." || in == "..") {
      in.clear();
    } else {
      const size_t next = in.find('/', in[0] == '/' ? 1 : 0);
      out += in.substr(0, next);
      in.erase(0, next == std::string::npos ? in.size() : next);
    }
  }
  return out;
}

std::string compose(const Uri& u) {
  std::string out;
  if (u.scheme) out += *u.scheme + ":";
  if (u.authority) out += "//" + *u.authority;
  out += u.path;
  if (u.query) out += "?" + *u.query;
  if (u.fragment) out += "#" + *u.fragment;
  return out;
}

std::string without_fragment(const std::string& uri) { return uri.substr(0, uri.find('#')); }

std::string escape_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else if (c == '%') out += "%25";  // $ref fragments are percent-decoded
    else out += c;
  }
  return out;
}

constexpr int kMaxWalkDepth = 200;  // deeper schemas are refused by the compiler anyway

// The schema-valued places of a schema object, as JSON Schema defines them.
bool single_schema(std::string_view k) {
  return k == "items" || k == "additionalProperties" || k == "not" || k == "if" || k == "then" || k == "else" ||
         k == "contains" || k == "propertyNames" || k == "additionalItems" || k == "unevaluatedItems" ||
         k == "unevaluatedProperties";
}
bool schema_map(std::string_view k) {
  return k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions" ||
         k == "dependentSchemas" || k == "dependencies";
}
bool schema_list(std::string_view k) { return k == "allOf" || k == "anyOf" || k == "oneOf" || k == "prefixItems" || k == "items"; }

class Resolver {
 public:
  explicit Resolver(const Json& root) {
    const std::string dialect =
        root.is_object() && root.contains("$schema") && root["$schema"].is_string() ? root["$schema"].get<std::string>() : "";
    if (dialect.find("draft-04") != std::string::npos || dialect.find("draft-03") != std::string::npos) id_key_ = "id";
    // Up to draft 7, a schema with "$ref" is that reference alone: its $id sets no base.
    for (const char* old : {"draft-03", "draft-04", "draft-06", "draft-07"})
      if (dialect.find(old) != std::string::npos) ref_hides_id_ = true;
  }

  // Pass 1: the resources (ids) and anchors, by absolute URI.
  void index(const Json& s, const std::string& pointer, std::string base, int depth) {
    if (!s.is_object() || depth > kMaxWalkDepth) return;
    base = base_of(s, pointer, base, depth == 0);
    if (s.contains("$ref") && s["$ref"].is_string() && !s["$ref"].get<std::string>().starts_with("#")) needed_ = true;
    if (s.contains("$recursiveRef") || s.contains("$dynamicRef")) needed_ = true;
    for (const char* anchor : {"$anchor", "$dynamicAnchor"})
      if (s.contains(anchor) && s[anchor].is_string())
        anchors_.emplace(without_fragment(base) + "#" + s[anchor].get<std::string>(), pointer);
    for_children(s, pointer, [&](const Json& child, const std::string& at) { index(child, at, base, depth + 1); });
  }

  // Pass 2: each "$ref" rewritten as a pointer where it resolves within the document.
  void rewrite(Json& s, const std::string& pointer, std::string base, int depth) {
    if (!s.is_object() || depth > kMaxWalkDepth) return;
    base = base_of(s, pointer, base, false);
    if (s.contains("$ref") && s["$ref"].is_string()) {
      const std::string ref = s["$ref"].get<std::string>();
      if (ref.size() <= 4096) {
        if (const auto local = locate(resolve_uri(base, ref)); local && *local != ref) {
          s["$ref"] = *local;
          changed_ = true;
        }
      }
    }
    // In a document of one resource the dynamic scope has one place to look, so
    // $recursiveRef and $dynamicRef name what $ref would.
    for (const char* dynamic : {"$recursiveRef", "$dynamicRef"})
      if (s.contains(dynamic) && s[dynamic].is_string() && !s.contains("$ref") && resources_.size() == 1) {
        if (const auto local = locate(resolve_uri(base, s[dynamic].get<std::string>()))) {
          s["$ref"] = *local;
          s.erase(dynamic);
          changed_ = true;
        }
      }
    for_children_mut(s, pointer, [&](Json& child, const std::string& at) { rewrite(child, at, base, depth + 1); });
  }

  // Whether some ref may need rewriting: one that is not a bare fragment, or a named anchor.
  bool needed() const { return needed_ || !anchors_.empty(); }
  bool changed() const { return changed_; }

 private:
  std::string base_of(const Json& s, const std::string& pointer, const std::string& base, bool record) {
    if (!s.contains(id_key_) || !s[id_key_].is_string() || (ref_hides_id_ && s.contains("$ref"))) {
      if (record || pointer.empty()) resources_.emplace(without_fragment(base), pointer);
      return base;
    }
    const std::string id = s[id_key_].get<std::string>();
    if (!id.empty() && id[0] == '#') {  // draft 6/7: a plain-name fragment
      anchors_.emplace(without_fragment(base) + id, pointer);
      if (pointer.empty()) resources_.emplace(without_fragment(base), pointer);
      return base;
    }
    const std::string resolved = resolve_uri(base, id);
    resources_.emplace(without_fragment(resolved), pointer);
    return resolved;
  }

  std::optional<std::string> locate(const std::string& uri) const {
    const size_t hash = uri.find('#');
    const std::string resource = uri.substr(0, hash), fragment = hash == std::string::npos ? "" : uri.substr(hash + 1);
    const auto it = resources_.find(resource);
    if (it == resources_.end()) return std::nullopt;
    if (fragment.empty() || fragment[0] == '/') return "#" + it->second + fragment;
    const auto anchor = anchors_.find(resource + "#" + fragment);
    if (anchor == anchors_.end()) return std::nullopt;
    return "#" + anchor->second;
  }

  template <class J, class F>
  static void children(J& s, const std::string& pointer, F&& f) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& key = it.key();
      J& v = it.value();
      const std::string at = pointer + "/" + escape_token(key);
      if (single_schema(key) && (v.is_object() || v.is_boolean())) f(v, at);
      if (schema_map(key) && v.is_object())
        for (auto sub = v.begin(); sub != v.end(); ++sub) f(sub.value(), at + "/" + escape_token(sub.key()));
      if (schema_list(key) && v.is_array())
        for (size_t i = 0; i < v.size(); ++i) f(v[i], at + "/" + std::to_string(i));
    }
  }
  template <class F>
  void for_children(const Json& s, const std::string& pointer, F&& f) { children<const Json>(s, pointer, f); }
  template <class F>
  void for_children_mut(Json& s, const std::string& pointer, F&& f) { children<Json>(s, pointer, f); }

  std::string id_key_ = "$id";
  bool ref_hides_id_ = false;
  std::map<std::string, std::string> resources_, anchors_;  // absolute URI -> pointer
  bool needed_ = false, changed_ = false;
};

}  // namespace

std::string resolve_uri(const std::string& base_text, const std::string& reference) {
  const Uri r = parse_uri(reference), base = parse_uri(base_text);
  Uri t;
  if (r.scheme) {
    t = r;
    t.path = remove_dot_segments(r.path);
  } else {
    if (r.authority) {
      t.authority = r.authority;
      t.path = remove_dot_segments(r.path);
      t.query = r.query;
    } else {
      if (r.path.empty()) {
        t.path = base.path;
        t.query = r.query ? r.query : base.query;
      } else {
        if (r.path[0] == '/') {
          t.path = remove_dot_segments(r.path);
        } else {
          // Merge (5.2.3): the base's path up to its last "/", then the reference's.
          std::string merged;
          if (base.authority && base.path.empty()) merged = "/" + r.path;
          else {
            const size_t slash = base.path.rfind('/');
            merged = (slash == std::string::npos ? "" : base.path.substr(0, slash + 1)) + r.path;
          }
          t.path = remove_dot_segments(merged);
        }
        t.query = r.query;
      }
      t.authority = base.authority;
    }
    t.scheme = base.scheme;
  }
  t.fragment = r.fragment;
  return compose(t);
}

std::optional<Json> with_local_refs(const Json& document) {
  Resolver resolver(document);
  resolver.index(document, "", "", 0);
  if (!resolver.needed()) return std::nullopt;
  Json copy = document;
  resolver.rewrite(copy, "", "", 0);
  if (!resolver.changed()) return std::nullopt;
  return copy;
}

}  // namespace dsv4::constrain
