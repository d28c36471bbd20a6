#include "dsv4/constrain/answer_grammar.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "dsv4/text/chat_format.h"

namespace dsv4::constrain {
namespace {

namespace chat = text::chat;

// Raw-text forms (DSML string="true") of the strings a compiled JSON value may be: its free
// string nodes and the string constants, each ended by "</" + ｜DSML｜.
NodeId raw_alternatives(Grammar& g, NodeId value, Symbol dsml) {
  std::vector<NodeId> strings;
  std::vector<std::string> constants;
  std::set<NodeId> seen;
  std::vector<NodeId> todo = {value};
  while (!todo.empty()) {
    const NodeId id = todo.back();
    todo.pop_back();
    if (!seen.insert(id).second) continue;
    const Node& n = g.node(id);
    if (n.kind == NodeKind::kAnyOf) {
      todo.insert(todo.end(), n.children.begin(), n.children.end());
    } else if (n.kind == NodeKind::kString && n.exclude == SymbolTrie::kNone) {
      strings.push_back(id);
    } else if (n.kind == NodeKind::kLiteral) {
      for (const std::string& text : n.texts) {
        const Json v = Json::parse(text);
        if (v.is_string() && v.get<std::string>().find(dsml_marker()) == std::string::npos)
          constants.push_back(v.get<std::string>());
      }
    }
  }
  std::vector<NodeId> alts;
  for (NodeId s : strings) {
    const Node n = g.node(s);
    alts.push_back(g.raw_text(dsml, n.min, n.max, dsml_marker()));
  }
  if (!constants.empty()) {
    std::vector<std::vector<Symbol>> lits;
    for (const std::string& c : constants) {
      std::vector<Symbol> sym;
      for (char ch : c) sym.push_back(static_cast<uint8_t>(ch));
      sym.push_back('<');
      sym.push_back('/');
      sym.push_back(dsml);
      lits.push_back(std::move(sym));
    }
    std::sort(lits.begin(), lits.end());
    lits.erase(std::unique(lits.begin(), lits.end()), lits.end());
    alts.push_back(g.literal(lits));
  }
  return alts.empty() ? kNoNode : g.any_of(std::move(alts));
}

class Builder {
 public:
  Builder(Grammar& g, const SchemaLimits& limits) : g_(g), schemas_(g, limits) {}

  NodeId tool_block(const std::vector<ToolSchema>& tools, size_t max_calls) {
    dsml_ = g_.special(chat::kDsml);
    const std::string d(chat::kDsml);
    std::vector<NodeId> invokes;
    for (const ToolSchema& t : tools) invokes.push_back(invoke(t));
    const NodeId calls = g_.repeat(g_.any_of(std::move(invokes)), g_.literal_text("\n"), 1,
                                   static_cast<uint32_t>(std::max<size_t>(max_calls, 1)));
    return g_.seq({g_.literal_text("\n\n<" + d + "tool_calls>\n"), calls, g_.literal_text("\n</" + d + "tool_calls>")});
  }

  NodeId content(const Json& schema, const std::string& where, bool strict) {
    try {
      const NodeId node = schemas_.compile(schema, false, strict);
      note_dropped(where);
      return node;
    } catch (const SchemaError& e) {
      throw e.at(where);
    }
  }

  const std::vector<std::string>& dropped() const { return dropped_; }

  NodeId reasoning() {
    const Symbol end = g_.special(chat::kThinkEnd);
    return g_.until(end, chat::kThinkEnd);
  }

 private:
  NodeId invoke(const ToolSchema& t) {
    const std::string d(chat::kDsml);
    for (char c : t.name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
        fail("the tool name \"{}\" cannot be written in a tool call", t.name);
    NodeId params;
    try {
      params = parameters(t);
      note_dropped(t.where);
    } catch (const SchemaError& e) {
      throw e.at(t.where);
    }
    return g_.seq({g_.literal_text("<" + d + "invoke name=\"" + t.name + "\">\n"), params,
                   g_.literal_text("\n</" + d + "invoke>")});
  }

  NodeId parameters(const ToolSchema& t) {
    if (!t.parameters) return g_.object(ObjectSyntax::kDsml, {}, kNoNode);
    const Json& p = *t.parameters;
    if (!p.is_object()) throw SchemaError({}, "", "a forced tool call needs \"parameters\" to be an object schema");
    static const std::set<std::string, std::less<>> allowed = {
        "type", "properties", "required", "additionalProperties", "$defs", "definitions", "$id"};
    for (const auto& [key, value] : p.items()) {
      if (is_assertion(key) && !allowed.count(key))
        schemas_.unsupported(t.strict, SchemaError({}, key, fmt::format("unsupported keyword \"{}\" at the top of a forced tool "
                                                                        "call's parameters (they must be an object "
                                                                        "schema with properties)",
                                                                        key)));
    }
    if (p.contains("type") && p["type"] != "object")
      throw SchemaError({}, "type", "a forced tool call's parameters must have \"type\": \"object\"");
    const Json* props = p.contains("properties") ? &p["properties"] : nullptr;
    if (props && !props->is_object()) throw SchemaError({}, "properties", "\"properties\" must be an object");
    std::vector<std::string> required;
    if (p.contains("required")) {
      if (!p["required"].is_array()) throw SchemaError({}, "required", "\"required\" must be an array of property names");
      for (const Json& r : p["required"]) {
        if (!r.is_string()) throw SchemaError({}, "required", "\"required\" must be an array of property names");
        required.push_back(r.get<std::string>());
      }
    }
    const bool closed = p.contains("additionalProperties") && p["additionalProperties"] == false;
    if (p.contains("additionalProperties") && !p["additionalProperties"].is_boolean() && !p["additionalProperties"].is_object())
      throw SchemaError({}, "additionalProperties", "\"additionalProperties\" must be a boolean or a schema");

    std::vector<std::pair<std::string, const Json*>> declared;
    std::vector<std::string> where_of;
    if (props)
      for (const auto& [name, schema] : props->items()) declared.emplace_back(name, &schema);
    static const Json kAny = true;
    for (const std::string& r : required) {
      if (props && props->contains(r)) continue;
      if (closed)
        throw SchemaError({}, "required", fmt::format("\"{}\" is required, but it is not in \"properties\" and "
                                                      "\"additionalProperties\" is false",
                                                      r));
      declared.emplace_back(r, p.contains("additionalProperties") ? &p["additionalProperties"] : &kAny);
    }
    const std::string d(chat::kDsml);
    std::vector<Property> out;
    for (const auto& [name, schema] : declared) {
      const bool from_props = props && props->contains(name) && &(*props)[name] == schema;
      std::vector<std::string> path = from_props ? std::vector<std::string>{"properties", name}
                                                 : std::vector<std::string>{"additionalProperties"};
      check_name(name, path);
      const NodeId json = schemas_.compile_part(p, *schema, path, true, t.strict);
      std::vector<NodeId> forms;
      if (const NodeId raw = raw_alternatives(g_, json, dsml_); raw != kNoNode)
        forms.push_back(g_.seq({g_.literal_text("true\">"), raw, g_.literal_text("parameter>")}));
      forms.push_back(g_.seq({g_.literal_text("false\">"), json, g_.literal_text("</" + d + "parameter>")}));
      Property prop;
      prop.name = name;
      prop.key = "<" + d + "parameter name=\"" + name + "\" string=\"";
      prop.value = g_.any_of(std::move(forms));
      prop.required = std::find(required.begin(), required.end(), name) != required.end();
      out.push_back(std::move(prop));
    }
    return g_.object(ObjectSyntax::kDsml, std::move(out), kNoNode);
  }

  // A parameter name sits in name="…": it cannot hold a quote, a control character or the
  // text of a special token the block is written with.
  void check_name(const std::string& name, const std::vector<std::string>& path) const {
    bool ok = !name.empty();
    for (char c : name) ok = ok && c != '"' && static_cast<unsigned char>(c) >= 0x20;
    for (const std::string& sp : g_.specials()) ok = ok && name.find(sp) == std::string::npos;
    if (name.find(chat::kThinkEnd) != std::string::npos) ok = false;
    if (!ok)
      throw SchemaError(path, "", fmt::format("the parameter name \"{}\" cannot be written in a tool call (empty, or it "
                                              "holds a quote, a control character or a special token)",
                                              name));
  }

  // The compiler's newly dropped assertions, as places inside the document `where`.
  void note_dropped(const std::string& where) {
    for (size_t i = noted_; i < schemas_.dropped().size(); ++i) dropped_.push_back(schemas_.dropped()[i].at(where).param());
    noted_ = schemas_.dropped().size();
  }

  Grammar& g_;
  SchemaCompiler schemas_;
  Symbol dsml_ = 0;
  size_t noted_ = 0;
  std::vector<std::string> dropped_;
};

}  // namespace

Grammar build_answer_grammar(const AnswerFormat& f, const SchemaLimits& limits, std::vector<std::string>* dropped) {
  Grammar g;
  Builder b(g, limits);
  // Specials are registered before any text is turned into symbols.
  if (!f.tools.empty() || f.calls_required) g.special(chat::kDsml);
  if (f.thinking) g.special(chat::kThinkEnd);
  NodeId body;
  if (f.calls_required) {
    if (f.tools.empty()) fail("a required tool call needs at least one tool");
    body = b.tool_block(f.tools, f.max_calls);
  } else {
    if (!f.content_schema) fail("nothing to constrain: no content schema and no required tool call");
    body = b.content(*f.content_schema, f.content_where, f.content_strict);
    if (!f.tools.empty()) body = g.any_of({body, b.tool_block(f.tools, f.max_calls)});
  }
  const NodeId root = f.thinking ? g.seq({b.reasoning(), body}) : body;
  if (dropped) *dropped = b.dropped();
  try {
    g.finalize(root);
  } catch (const SchemaError&) {
    throw;
  } catch (const Error& e) {
    throw SchemaError({}, "", e.what(), f.calls_required || f.content_where.empty() ? "" : f.content_where);
  }
  return g;
}

}  // namespace dsv4::constrain
