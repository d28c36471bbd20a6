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
      nodes_.back().depth = nodes_[at].depth + 1;
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

void SymbolTrie::finish_lengths() {
  // Children have higher indices than their parent: one backward pass.
  shortest_.assign(nodes_.size(), std::numeric_limits<uint32_t>::max());
  for (size_t i = nodes_.size(); i-- > 0;) {
    if (nodes_[i].value != kNone) {
      shortest_[i] = 0;
      continue;
    }
    for (const Edge& e : nodes_[i].edges)
      if (shortest_[e.to] != std::numeric_limits<uint32_t>::max()) shortest_[i] = std::min(shortest_[i], shortest_[e.to] + 1);
  }
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
                       std::string_view forbid, const std::vector<std::string>& forbidden_names, NodeId free_key) {
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
  for (size_t k = 0; k < forbidden_names.size(); ++k) {
    std::vector<Symbol> raw;
    for (char c : forbidden_names[k]) raw.push_back(static_cast<uint8_t>(c));
    sh.raw_names.insert(raw, n + static_cast<uint32_t>(k));
  }
  sh.keys.finish_build();
  sh.next_required.assign(n + 1, n);
  for (uint32_t i = n; i-- > 0;) sh.next_required[i] = sh.properties[i].required ? i : sh.next_required[i + 1];
  const uint32_t shape = static_cast<uint32_t>(shapes_.size());
  shapes_.push_back(std::move(sh));
  if (additional != kNoNode && free_key != kNoNode) {
    if (nodes_[free_key].kind != NodeKind::kPattern || nodes_[free_key].bare) fail("constrain: a free key must be a string");
    shapes_[shape].free_key = free_key;
  } else if (additional != kNoNode) {
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

NodeId Grammar::pattern_node(const ByteDfa& dfa, bool bare) {
  ByteDfa d = writable_in_json(dfa);
  if (d.start == ByteDfa::kDead) return kNoNode;
  // Fewest symbols to the closing quote from each state: shortest paths over the reversed
  // automaton, a byte costing what writing it takes (Dijkstra; costs are 1 or 2).
  const uint32_t n = d.size();
  std::vector<uint32_t> class_cost(d.classes, 2);
  for (int b = 0; b < 256; ++b)
    class_cost[d.byte_class[b]] = std::min(class_cost[d.byte_class[b]], written_symbols(uint8_t(b)));
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> back(n);  // (from, cost)
  for (uint32_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < d.classes; ++c)
      if (const uint32_t t = d.table[size_t(s) * d.classes + c]; t != ByteDfa::kDead) back[t].push_back({s, class_cost[c]});
  std::vector<uint64_t> rest(n, kNever);
  std::vector<std::vector<uint32_t>> buckets(1);
  for (uint32_t s = 0; s < n; ++s)
    if (d.accept[s]) {
      rest[s] = 1;  // the closing quote
      buckets[0].push_back(s);
    }
  for (size_t k = 0; k < buckets.size(); ++k) {
    for (size_t i = 0; i < buckets[k].size(); ++i) {
      const uint32_t s = buckets[k][i];
      if (rest[s] != k + 1) continue;  // reached more cheaply since
      for (const auto& [from, cost] : back[s]) {
        if (rest[from] <= k + 1 + cost) continue;
        rest[from] = k + 1 + cost;
        if (buckets.size() <= k + cost) buckets.resize(k + cost + 1);
        buckets[k + cost].push_back(from);
      }
    }
  }
  dfas_.push_back(std::move(d));
  dfa_rest_.push_back(std::move(rest));
  Node node;
  node.kind = NodeKind::kPattern;
  node.bare = bare;
  node.index = static_cast<uint32_t>(dfas_.size() - 1);
  return add(std::move(node));
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
        case NodeKind::kPattern:
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
  compute_min_symbols();
  if (min_frames_[root] >= kInf) fail("no finite value satisfies the schema (every value would need itself inside)");
  if (min_frames_[root] > kMaxFrames)
    fail("the schema's smallest value nests {} levels deep; at most {} are supported", min_frames_[root], kMaxFrames);
  root_ = root;
}

namespace {
uint64_t add_sat(uint64_t a, uint64_t b) { return std::min(a + b, kNever); }
uint64_t mul_sat(uint64_t a, uint64_t k) { return k == 0 ? 0 : a >= kNever / k ? kNever : std::min(a * k, kNever); }
}  // namespace

// Fewest symbols of each node's texts: a fixpoint like min_frames (values only fall, recursion
// through containers converges, nodes that stay kNever admit no finite text), then what each
// object frame needs from each position, and whether each node's texts always close.
void Grammar::compute_min_symbols() {
  const size_t count = nodes_.size();
  for (SymbolTrie& t : tries_) t.finish_lengths();
  for (ObjectShape& sh : shapes_) sh.keys.finish_lengths();
  // Key lengths in symbols (DSML keys hold the ｜DSML｜ special), colon included for JSON.
  std::vector<std::vector<uint32_t>> key_len(shapes_.size());
  for (size_t s = 0; s < shapes_.size(); ++s) {
    const ObjectShape& sh = shapes_[s];
    key_len[s].resize(sh.properties.size());
    for (size_t j = 0; j < sh.properties.size(); ++j) {
      const Property& p = sh.properties[j];
      key_len[s][j] = static_cast<uint32_t>(sh.syntax == ObjectSyntax::kDsml ? symbols(p.key).size() : p.key.size() + 1);
    }
  }
  min_symbols_.assign(count, kNever);
  for (bool changed = true; changed;) {
    changed = false;
    for (NodeId id = 0; id < count; ++id) {
      const Node& n = nodes_[id];
      uint64_t v = kNever;
      switch (n.kind) {
        case NodeKind::kLiteral: v = tries_[n.index].shortest_below(0); break;
        case NodeKind::kString: v = add_sat(2, n.min); break;                // "…" of ASCII characters
        case NodeKind::kPattern: {
          const uint64_t rest = dfa_rest(n.index, dfas_[n.index].start);  // from inside the quotes
          v = n.bare ? rest - 1 : add_sat(1, rest);
          break;
        }
        case NodeKind::kRawText: v = add_sat(3, n.min); break;               // text, "</", terminator
        case NodeKind::kNumber: v = 1; break;                                 // 0
        case NodeKind::kUntil: v = 1; break;                                  // the terminator
        case NodeKind::kArray:
          v = add_sat(2, add_sat(mul_sat(min_symbols_[n.item], n.min), n.min > 0 ? n.min - 1 : 0));
          break;
        case NodeKind::kRepeat:
          v = add_sat(mul_sat(min_symbols_[n.item], n.min),
                      mul_sat(n.sep == kNoNode ? 0 : min_symbols_[n.sep], n.min > 0 ? n.min - 1 : 0));
          break;
        case NodeKind::kObject: {
          const ObjectShape& sh = shapes_[n.index];
          const bool json = sh.syntax == ObjectSyntax::kJson;
          uint64_t sum = 0, required = 0;
          for (size_t j = 0; j < sh.properties.size(); ++j) {
            if (!sh.properties[j].required) continue;
            sum = add_sat(sum, add_sat(key_len[n.index][j], min_symbols_[sh.properties[j].value]));
            ++required;
          }
          // JSON: braces and commas; DSML: the "\n" between parameters.
          v = add_sat(sum, json ? 2 + (required > 0 ? required - 1 : 0) : (required > 0 ? required - 1 : 0));
          break;
        }
        case NodeKind::kSeq:
          v = 0;
          for (NodeId c : n.children) v = add_sat(v, min_symbols_[c]);
          break;
        case NodeKind::kAnyOf:
          for (NodeId c : n.children) v = std::min(v, min_symbols_[c]);
          break;
      }
      if (v < min_symbols_[id]) {
        min_symbols_[id] = v;
        changed = true;
      }
    }
  }
  for (size_t s = 0; s < shapes_.size(); ++s) {
    ObjectShape& sh = shapes_[s];
    const size_t n = sh.properties.size();
    sh.key_symbols.assign(key_len[s].begin(), key_len[s].end());
    sh.required_cost.assign(n + 1, 0);
    sh.required_left.assign(n + 1, 0);
    sh.cheapest_from.assign(n + 1, kNever);
    for (size_t j = n; j-- > 0;) {
      const uint64_t cost = add_sat(key_len[s][j], min_symbols_[sh.properties[j].value]);
      const bool req = sh.properties[j].required;
      sh.required_cost[j] = add_sat(sh.required_cost[j + 1], req ? cost : 0);
      sh.required_left[j] = sh.required_left[j + 1] + (req ? 1 : 0);
      sh.cheapest_from[j] = std::min(sh.cheapest_from[j + 1], cost);
    }
  }
  // Closing: a fixpoint from "yes" down (a recursive node closes unless some path says not).
  closes_.assign(count, 1);
  for (bool changed = true; changed;) {
    changed = false;
    for (NodeId id = 0; id < count; ++id) {
      const Node& n = nodes_[id];
      bool v = true;
      switch (n.kind) {
        case NodeKind::kLiteral: {
          // Every string of the set must be a leaf (no string is a prefix of another).
          const SymbolTrie& t = tries_[n.index];
          for (uint32_t k = 0; k < t.size() && v; ++k) v = !(t.terminal(k) && t.has_children(k));
          break;
        }
        case NodeKind::kString:
        case NodeKind::kRawText:
        case NodeKind::kUntil:
        case NodeKind::kArray: v = true; break;
        case NodeKind::kPattern: v = !n.bare; break;  // a number may go on
        case NodeKind::kNumber: v = false; break;
        case NodeKind::kObject: v = shapes_[n.index].syntax == ObjectSyntax::kJson; break;
        case NodeKind::kRepeat: v = n.min == n.max && closes_[n.item]; break;
        case NodeKind::kSeq: v = !n.children.empty() && min_symbols_[n.children.back()] > 0 && closes_[n.children.back()]; break;
        case NodeKind::kAnyOf:
          for (NodeId c : n.children) v = v && closes_[c];
          break;
      }
      if (!v && closes_[id]) {
        closes_[id] = 0;
        changed = true;
      }
    }
  }
  // As the output's end: the alternative or last part that is shortest with its end token.
  min_ending_.assign(count, kNever);
  for (bool changed = true; changed;) {
    changed = false;
    for (NodeId id = 0; id < count; ++id) {
      const Node& n = nodes_[id];
      uint64_t v = add_sat(min_symbols_[id], closes_[id] ? 0 : 1);
      if (n.kind == NodeKind::kAnyOf) {
        for (NodeId c : n.children) v = std::min(v, min_ending_[c]);
      } else if (n.kind == NodeKind::kSeq && !n.children.empty()) {
        uint64_t head = 0;
        for (size_t i = 0; i + 1 < n.children.size(); ++i) head = add_sat(head, min_symbols_[n.children[i]]);
        v = std::min(v, add_sat(head, min_ending_[n.children.back()]));
      }
      if (v < min_ending_[id]) {
        min_ending_[id] = v;
        changed = true;
      }
    }
  }
}

size_t Grammar::memory_bytes() const {
  size_t bytes = nodes_.size() * (sizeof(Node) + 21);
  for (const Node& n : nodes_) {
    bytes += n.children.size() * sizeof(NodeId);
    for (const auto& t : n.texts) bytes += t.size() + sizeof(std::string);
  }
  for (const SymbolTrie& t : tries_) bytes += t.size() * 48;
  for (const ObjectShape& s : shapes_) bytes += s.keys.size() * 64 + s.properties.size() * 64;
  bytes += patterns_.size() * 16 * 256;
  for (size_t i = 0; i < dfas_.size(); ++i) bytes += dfas_[i].memory_bytes() + dfa_rest_[i].size() * sizeof(uint64_t);
  return bytes;
}

}  // namespace dsv4::constrain
