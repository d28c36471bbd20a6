#include "dsv4/constrain/grammar.h"

#include <algorithm>

#include "dsv4/util/error.h"

namespace dsv4::constrain {

// ---- SymbolTrie -----------------------------------------------------------------------------

SymbolTrie::SymbolTrie() : nodes_(1) {}

bool SymbolTrie::insert(std::span<const Symbol> s, uint32_t value) {
  uint32_t at = 0;
  for (Symbol sym : s) {
    uint32_t next = child(at, sym);
    if (next == kNone) {
      next = static_cast<uint32_t>(nodes_.size());
      auto& edges = nodes_[at].edges;
      auto pos = std::lower_bound(edges.begin(), edges.end(), sym, [](const Edge& e, Symbol x) { return e.symbol < x; });
      edges.insert(pos, Edge{sym, next});
      nodes_.emplace_back();
    }
    at = next;
  }
  if (nodes_[at].value != kNone) return false;
  nodes_[at].value = value;
  return true;
}

uint32_t SymbolTrie::child(uint32_t node, Symbol s) const {
  const auto& edges = nodes_[node].edges;
  auto pos = std::lower_bound(edges.begin(), edges.end(), s, [](const Edge& e, Symbol x) { return e.symbol < x; });
  return pos != edges.end() && pos->symbol == s ? pos->to : kNone;
}

void SymbolTrie::finish_build() {
  // Children always have higher indices than their parent, so one backward pass collects
  // every node's values from its children.
  std::vector<std::vector<uint32_t>> below(nodes_.size());
  for (size_t i = nodes_.size(); i-- > 0;) {
    if (nodes_[i].value != kNone) below[i].push_back(nodes_[i].value);
    for (const Edge& e : nodes_[i].edges) below[i].insert(below[i].end(), below[e.to].begin(), below[e.to].end());
    std::sort(below[i].begin(), below[i].end());
  }
  below_start_.assign(nodes_.size() + 1, 0);
  below_.clear();
  for (size_t i = 0; i < nodes_.size(); ++i) {
    below_start_[i] = static_cast<uint32_t>(below_.size());
    below_.insert(below_.end(), below[i].begin(), below[i].end());
  }
  below_start_[nodes_.size()] = static_cast<uint32_t>(below_.size());
}

std::span<const uint32_t> SymbolTrie::values_below(uint32_t node) const {
  return std::span<const uint32_t>(below_).subspan(below_start_[node], below_start_[node + 1] - below_start_[node]);
}

// ---- BytePattern ----------------------------------------------------------------------------

BytePattern::BytePattern(std::string_view pattern) : pattern_(pattern) {
  const size_t m = pattern_.size();
  if (m > 15) fail("constrain: forbidden patterns are at most 15 bytes");
  table_.assign((m + 1) * 256, 0);
  if (m == 0) return;
  // table[state][b]: the longest prefix of the pattern that is a suffix of (matched prefix + b).
  std::vector<uint32_t> fallback(m + 1, 0);
  for (size_t q = 0; q <= m; ++q) {
    for (int b = 0; b < 256; ++b) {
      uint32_t next;
      if (q < m && static_cast<uint8_t>(pattern_[q]) == b) next = static_cast<uint32_t>(q + 1);
      else if (q == 0) next = 0;
      else next = table_[fallback[q] * 256 + b];
      table_[q * 256 + b] = static_cast<uint8_t>(next);
    }
    if (q > 0 && q < m) fallback[q + 1] = table_[fallback[q] * 256 + static_cast<uint8_t>(pattern_[q])];
  }
}

// ---- Grammar building -----------------------------------------------------------------------

Grammar::Grammar() { patterns_.emplace_back(); }

Symbol Grammar::special(std::string_view text) {
  for (size_t i = 0; i < specials_.size(); ++i)
    if (specials_[i] == text) return static_cast<Symbol>(kFirstSpecial + i);
  if (specials_.size() >= kMaxSpecials) fail("constrain: too many special tokens in one grammar");
  specials_.emplace_back(text);
  return static_cast<Symbol>(kFirstSpecial + specials_.size() - 1);
}

std::vector<Symbol> Grammar::symbols(std::string_view text) const {
  std::vector<Symbol> out;
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (size_t k = 0; k < specials_.size(); ++k) {
      if (!specials_[k].empty() && text.substr(i, specials_[k].size()) == specials_[k]) {
        out.push_back(static_cast<Symbol>(kFirstSpecial + k));
        i += specials_[k].size();
        matched = true;
        break;
      }
    }
    if (!matched) out.push_back(static_cast<uint8_t>(text[i++]));
  }
  return out;
}

NodeId Grammar::add(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<NodeId>(nodes_.size() - 1);
}

uint32_t Grammar::add_pattern(std::string_view forbid) {
  if (forbid.empty()) return 0;
  patterns_.emplace_back(forbid);
  return static_cast<uint32_t>(patterns_.size() - 1);
}

NodeId Grammar::literal(const std::vector<std::vector<Symbol>>& strings, std::vector<std::string> json_texts) {
  if (strings.empty()) fail("constrain: a literal needs at least one string");
  SymbolTrie trie;
  uint32_t i = 0;
  for (const auto& s : strings) {
    if (s.empty()) fail("constrain: a literal string is empty");
    trie.insert(s, i++);
  }
  tries_.push_back(std::move(trie));
  Node n;
  n.kind = NodeKind::kLiteral;
  n.index = static_cast<uint32_t>(tries_.size() - 1);
  n.texts = std::move(json_texts);
  return add(std::move(n));
}

NodeId Grammar::string(uint32_t min_len, uint32_t max_len, std::string_view forbid) {
  Node n;
  n.kind = NodeKind::kString;
  n.min = min_len;
  n.max = max_len;
  n.pattern = add_pattern(forbid);
  return add(std::move(n));
}

NodeId Grammar::raw_text(Symbol terminator, uint32_t min_len, uint32_t max_len, std::string_view forbid) {
  Node n;
  n.kind = NodeKind::kRawText;
  n.terminator = terminator;
  n.min = min_len;
  n.max = max_len;
  n.pattern = add_pattern(forbid);
  return add(std::move(n));
}

NodeId Grammar::number(bool integer) {
  Node n;
  n.kind = NodeKind::kNumber;
  n.integer = integer;
  return add(std::move(n));
}

NodeId Grammar::array(NodeId item, uint32_t min_items, uint32_t max_items) {
  Node n;
  n.kind = NodeKind::kArray;
  n.item = item;
  n.min = min_items;
  n.max = max_items;
  return add(std::move(n));
}

NodeId Grammar::object(ObjectSyntax syntax, std::vector<Property> properties, NodeId additional,
                       std::string_view forbid) {
  if (properties.size() > 4000) fail("constrain: too many properties in one object");
  if (syntax == ObjectSyntax::kDsml && additional != kNoNode) fail("constrain: DSML parameters have no free keys");
  ObjectShape sh;
  sh.syntax = syntax;
  sh.additional = additional;
  sh.properties = std::move(properties);
  const uint32_t n = static_cast<uint32_t>(sh.properties.size());
  for (uint32_t i = 0; i < n; ++i) {
    const Property& p = sh.properties[i];
    if (p.key.empty()) fail("constrain: a property key is empty");
    // JSON keys are plain bytes (a name may spell a special token's text); DSML openings hold
    // the ｜DSML｜ token.
    std::vector<Symbol> key;
    if (syntax == ObjectSyntax::kDsml) key = symbols(p.key);
    else
      for (char c : p.key) key.push_back(static_cast<uint8_t>(c));
    if (!sh.keys.insert(key, i)) fail("constrain: duplicate property key");
    std::vector<Symbol> raw;
    for (char c : p.name) raw.push_back(static_cast<uint8_t>(c));
    sh.raw_names.insert(raw, i);
  }
  sh.keys.finish_build();
  sh.next_required.assign(n + 1, n);
  for (uint32_t i = n; i-- > 0;) sh.next_required[i] = sh.properties[i].required ? i : sh.next_required[i + 1];
  const uint32_t shape = static_cast<uint32_t>(shapes_.size());
  shapes_.push_back(std::move(sh));
  if (additional != kNoNode) {
    Node key;
    key.kind = NodeKind::kString;
    key.no_escapes = true;
    key.exclude = shape;
    key.pattern = add_pattern(forbid);
    shapes_[shape].free_key = add(std::move(key));
  }
  Node node;
  node.kind = NodeKind::kObject;
  node.index = shape;
  return add(std::move(node));
}

NodeId Grammar::any_of(std::vector<NodeId> alternatives) {
  if (alternatives.empty()) fail("constrain: anyOf needs at least one alternative");
  if (alternatives.size() == 1) return alternatives[0];
  Node n;
  n.kind = NodeKind::kAnyOf;
  n.children = std::move(alternatives);
  return add(std::move(n));
}

NodeId Grammar::seq(std::vector<NodeId> parts) {
  if (parts.size() == 1) return parts[0];
  Node n;
  n.kind = NodeKind::kSeq;
  n.children = std::move(parts);
  return add(std::move(n));
}

NodeId Grammar::until(Symbol terminator, std::string_view forbid) {
  Node n;
  n.kind = NodeKind::kUntil;
  n.terminator = terminator;
  n.pattern = add_pattern(forbid);
  return add(std::move(n));
}

NodeId Grammar::repeat(NodeId item, NodeId separator, uint32_t min, uint32_t max) {
  if (max == 0 || min > max) fail("constrain: a repeat needs 0 < max and min <= max");
  Node n;
  n.kind = NodeKind::kRepeat;
  n.item = item;
  n.sep = separator;
  n.min = min;
  n.max = max;
  return add(std::move(n));
}

NodeId Grammar::placeholder() {
  Node n;
  n.kind = NodeKind::kAnyOf;
  return add(std::move(n));
}

void Grammar::define(NodeId placeholder, NodeId target) {
  Node& n = nodes_[placeholder];
  if (n.kind != NodeKind::kAnyOf || !n.children.empty()) fail("constrain: placeholder defined twice");
  n.children = {target};
}

void Grammar::finalize(NodeId root) {
  const size_t count = nodes_.size();
  for (const Node& n : nodes_)
    if (n.kind == NodeKind::kAnyOf && n.children.empty()) fail("constrain: an undefined reference");

  // Alternatives entered without reading anything must not lead back to themselves.
  std::vector<uint8_t> color(count, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<NodeId, size_t>> path;
  for (NodeId start = 0; start < count; ++start) {
    if (color[start]) continue;
    path.push_back({start, 0});
    color[start] = 1;
    while (!path.empty()) {
      auto& [id, next] = path.back();
      const Node& n = nodes_[id];
      std::vector<NodeId> edges;
      if (n.kind == NodeKind::kAnyOf) edges = n.children;
      else if (n.kind == NodeKind::kSeq && !n.children.empty()) edges = {n.children[0]};
      else if (n.kind == NodeKind::kRepeat) edges = {n.item};
      if (next < edges.size()) {
        const NodeId to = edges[next++];
        if (color[to] == 1) fail("the schema refers to itself without an object or array in between ($ref cycle)");
        if (color[to] == 0) {
          color[to] = 1;
          path.push_back({to, 0});
        }
      } else {
        color[id] = 2;
        path.pop_back();
      }
    }
  }

  // Fewest frames needed to complete each node (a fixpoint: recursion through containers
  // converges; nodes that stay infinite admit no finite text).
  constexpr uint32_t kInf = std::numeric_limits<uint32_t>::max() / 2;
  min_frames_.assign(count, kInf);
  for (bool changed = true; changed;) {
    changed = false;
    for (NodeId id = 0; id < count; ++id) {
      const Node& n = nodes_[id];
      uint32_t v = kInf;
      switch (n.kind) {
        case NodeKind::kLiteral:
        case NodeKind::kString:
        case NodeKind::kRawText:
        case NodeKind::kNumber:
        case NodeKind::kUntil: v = 1; break;
        case NodeKind::kArray: v = n.min == 0 ? 1 : 1 + min_frames_[n.item]; break;
        case NodeKind::kRepeat: v = n.min == 0 ? 1 : 1 + min_frames_[n.item]; break;
        case NodeKind::kObject: {
          uint32_t deepest = 0;
          for (const Property& p : shapes_[n.index].properties)
            if (p.required) deepest = std::max(deepest, min_frames_[p.value]);
          v = 1 + deepest;
          break;
        }
        case NodeKind::kSeq: {
          uint32_t deepest = 0;
          for (NodeId c : n.children) deepest = std::max(deepest, min_frames_[c]);
          v = 1 + deepest;
          break;
        }
        case NodeKind::kAnyOf:
          for (NodeId c : n.children) v = std::min(v, min_frames_[c]);
          break;
      }
      v = std::min(v, kInf);
      if (v < min_frames_[id]) {
        min_frames_[id] = v;
        changed = true;
      }
    }
  }
  if (min_frames_[root] >= kInf) fail("no finite value satisfies the schema (every value would need itself inside)");
  if (min_frames_[root] > kMaxFrames)
    fail("the schema's smallest value nests {} levels deep; at most {} are supported", min_frames_[root], kMaxFrames);
  root_ = root;
}

size_t Grammar::memory_bytes() const {
  size_t bytes = nodes_.size() * sizeof(Node) + min_frames_.size() * 4;
  for (const Node& n : nodes_) {
    bytes += n.children.size() * sizeof(NodeId);
    for (const auto& t : n.texts) bytes += t.size() + sizeof(std::string);
  }
  for (const SymbolTrie& t : tries_) bytes += t.size() * 48;
  for (const ObjectShape& s : shapes_) bytes += s.keys.size() * 64 + s.properties.size() * 64;
  bytes += patterns_.size() * 16 * 256;
  return bytes;
}

}  // namespace dsv4::constrain
