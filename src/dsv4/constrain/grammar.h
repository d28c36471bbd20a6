// The target of constrained decoding: a grammar over symbols (the 256 byte values, plus a few
// added tokens such as ｜DSML｜ that the chat format writes as single tokens), made of a small
// set of node kinds that JSON values and the DSML tool-call markup need. A JSON Schema
// (json_schema.h) or a tool-call block (tool_call_grammar.h) compiles to one of these.
//
// Recognition is a pushdown automaton run over sets of stacks: a stack is a list of frames
// (node, local state, counter), the top frame reads the next symbol, containers push their
// children. Alternatives (anyOf, a number that may end or go on) are separate stacks of one
// set, so the automaton is exact without backtracking; sets are canonical (sorted, unique), so
// equal situations compare equal and can be cached (matcher.h).
//
// Every state the automaton can reach can still be completed: the builder refuses grammars
// that admit no finite value (finalize()), and a child is only entered when its shortest
// completion fits the frame budget. So a stack is never a dead end, and a generation guided by
// this grammar can always finish.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/constrain/regex.h"

namespace dsv4::constrain {

using Symbol = uint16_t;   // 0..255: a byte; 256 + k: the grammar's k-th special token
using NodeId = uint32_t;
inline constexpr NodeId kNoNode = std::numeric_limits<NodeId>::max();
inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
inline constexpr Symbol kFirstSpecial = 256;
inline constexpr size_t kMaxSpecials = 8;
// "No finite text": the saturated value of symbol counts (shortest completions).
inline constexpr uint64_t kNever = uint64_t{1} << 50;

// Frames a stack may hold (nesting bound of generated text; each JSON container, string or
// number is one frame). A grammar whose shortest value needs more is refused.
inline constexpr uint32_t kMaxFrames = 48;
// Stacks one set may hold. More alternatives than this are cut (the first ones in canonical
// order stay): every kept stack is still a valid, completable parse, so output stays valid.
inline constexpr size_t kMaxStacks = 64;
// Longest run of whitespace accepted between two JSON tokens (bounds what a weak model can
// waste; enough for pretty-printed output).
inline constexpr uint32_t kMaxWhitespace = 20;
// Digits in the integer part, the fraction and the exponent of a generated number: every
// integer stays exact in a double, no number overflows one.
inline constexpr uint32_t kMaxIntDigits = 15, kMaxFracDigits = 15, kMaxExpDigits = 2;

// The byte a short JSON escape \<letter> writes (-1: not one), and the symbols a byte of a
// string's text takes when written (2 for those that must be escaped).
inline int short_escape(Symbol letter) {
  switch (letter) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return -1;
  }
}
inline uint32_t written_symbols(uint8_t byte) {
  return byte == '"' || byte == '\\' || byte < 0x20 ? 2 : 1;
}

enum class NodeKind : uint8_t {
  kLiteral,  // exactly one of a set of symbol strings
  kString,   // a JSON string "…" (escapes, \uXXXX with surrogate pairs, valid UTF-8)
  kRawText,  // DSML string="true" text: any UTF-8, ended by "</" + the terminator special
  kNumber,   // a JSON number (or integer)
  kArray,    // [ item, … ]
  kObject,   // { "key": value, … } (or DSML parameters)
  kAnyOf,    // one of several nodes (no frame of its own)
  kSeq,      // children one after another
  kUntil,    // free text ended by a special symbol (e.g. reasoning up to </think>)
  kRepeat,   // child (separator child)… between min and max times
  kPattern,  // a JSON string whose text a byte automaton accepts (pattern, format, lengths), or
             // bare: a number's text (numeric bounds)
};

// A set of symbol strings as a trie; node 0 is the root. Each terminal node carries the index
// of its string.
class SymbolTrie {
 public:
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  SymbolTrie();
  // Adds a string (returns false if it was there already).
  bool insert(std::span<const Symbol> s, uint32_t value);
  uint32_t child(uint32_t node, Symbol s) const;  // kNone if absent
  bool terminal(uint32_t node) const { return nodes_[node].value != kNone; }
  uint32_t value(uint32_t node) const { return nodes_[node].value; }
  bool has_children(uint32_t node) const { return !nodes_[node].edges.empty(); }
  size_t size() const { return nodes_.size(); }
  // Values of every string below `node` (sorted), after finish_build().
  std::span<const uint32_t> values_below(uint32_t node) const;
  void finish_build();
  // Symbols from the root to `node`.
  uint32_t depth(uint32_t node) const { return nodes_[node].depth; }
  // Fewest symbols from `node` to the end of a string (0 at a terminal), after finish_lengths().
  uint32_t shortest_below(uint32_t node) const { return shortest_[node]; }
  void finish_lengths();

 private:
  struct Edge {
    Symbol symbol;
    uint32_t to;
  };
  struct TrieNode {
    std::vector<Edge> edges;  // sorted by symbol
    uint32_t value = kNone;
    uint32_t depth = 0;
  };
  std::vector<TrieNode> nodes_;
  std::vector<uint32_t> below_, below_start_, shortest_;
};

// A forbidden byte pattern as a matching automaton (KMP): text that would contain it is
// refused. progress(state, byte) returns the new state; state == size() means "found".
class BytePattern {
 public:
  explicit BytePattern(std::string_view pattern = "");
  uint32_t next(uint32_t state, uint8_t byte) const { return table_[state * 256 + byte]; }
  uint32_t size() const { return static_cast<uint32_t>(pattern_.size()); }
  bool empty() const { return pattern_.empty(); }

 private:
  std::string pattern_;
  std::vector<uint8_t> table_;
};

enum class ObjectSyntax : uint8_t {
  kJson,  // { "k": v, "k2": v2 } with whitespace between tokens
  kDsml,  // <｜DSML｜parameter name="k" string="…">…</｜DSML｜parameter> joined by "\n"
};

struct Property {
  std::string name;  // the property's name (its decoded text)
  std::string key;   // the text that writes it (JSON: "\"name\"" encoded; DSML: the parameter opening)
  NodeId value = kNoNode;
  bool required = false;
};

struct ObjectShape {
  ObjectSyntax syntax = ObjectSyntax::kJson;
  std::vector<Property> properties;  // in the order they must be written
  SymbolTrie keys;                   // Property::key -> index
  SymbolTrie raw_names;              // Property::name bytes (free keys must not spell one)
  NodeId additional = kNoNode;       // value of other keys (JSON only); kNoNode: none allowed
  NodeId free_key = kNoNode;         // the kString node that spells other keys
  std::vector<uint32_t> next_required;  // [i]: first required index >= i (size n+1; n = none)
  // After Grammar::finalize, with cost(j) = the symbols of key j, ':' (JSON) and the shortest
  // value of property j:
  std::vector<uint32_t> key_symbols;    // [j]: the symbols of key j, ':' included (JSON)
  std::vector<uint64_t> required_cost;  // [i]: sum of cost(j) over required j >= i (size n+1)
  std::vector<uint32_t> required_left;  // [i]: required properties j >= i (size n+1)
  std::vector<uint64_t> cheapest_from;  // [i]: min of cost(j) over j >= i (size n+1; kNever past n)
};

struct Node {
  NodeKind kind = NodeKind::kLiteral;
  uint32_t min = 0, max = kUnbounded;  // string/raw text: code points; array/repeat: items
  uint32_t index = 0;                  // literal: trie; object: shape; pattern string: automaton
  bool integer = false;                // number: integers only
  bool no_escapes = false;             // string: a free object key (no backslash)
  bool bare = false;                   // pattern: no quotes (a number's text)
  uint32_t exclude = SymbolTrie::kNone;  // string: object whose declared names it must not spell
  uint32_t pattern = 0;                // string/raw/until: forbidden byte pattern (0 = none)
  Symbol terminator = 0;               // raw text/until: the special symbol that ends it
  NodeId item = kNoNode;               // array/repeat: the item; repeat: separator (sep)
  NodeId sep = kNoNode;
  std::vector<NodeId> children;        // anyOf alternatives, seq parts
  std::vector<std::string> texts;      // literal: the JSON texts it was built from (if any)
};

class Grammar {
 public:
  Grammar();

  // ---- building -------------------------------------------------------------------------
  // The special token texts become symbols 256, 257, … in the order first asked for.
  Symbol special(std::string_view token_text);
  // Symbols of `text` with each occurrence of a registered special's text as its symbol.
  std::vector<Symbol> symbols(std::string_view text) const;

  NodeId literal(const std::vector<std::vector<Symbol>>& strings, std::vector<std::string> json_texts = {});
  NodeId literal_text(std::string_view text) { return literal({symbols(text)}); }
  NodeId string(uint32_t min_len = 0, uint32_t max_len = kUnbounded, std::string_view forbid = "");
  NodeId raw_text(Symbol terminator, uint32_t min_len = 0, uint32_t max_len = kUnbounded, std::string_view forbid = "");
  NodeId number(bool integer);
  NodeId array(NodeId item, uint32_t min_items, uint32_t max_items);
  // Properties are written in the given order; `additional` (JSON only) is the value node of
  // keys not declared (kNoNode: none allowed), which are spelled without escapes and must
  // differ from every declared name and from each of `forbidden_names`; `forbid` applies to
  // their text.
  // `free_key`, when given, is the string node that spells other keys instead (a pattern
  // string whose automaton already leaves out the declared and forbidden names).
  NodeId object(ObjectSyntax syntax, std::vector<Property> properties, NodeId additional, std::string_view forbid = "",
                const std::vector<std::string>& forbidden_names = {}, NodeId free_key = kNoNode);
  NodeId any_of(std::vector<NodeId> alternatives);
  NodeId seq(std::vector<NodeId> parts);
  NodeId until(Symbol terminator, std::string_view forbid = "");
  NodeId repeat(NodeId item, NodeId separator, uint32_t min, uint32_t max);
  // A JSON string whose decoded text `dfa` accepts. It is written with the short escapes
  // (\" \\ \/ \b \f \n \r \t) where it needs them, never \uXXXX; kNoNode when no such string
  // exists.
  NodeId pattern_string(const ByteDfa& dfa) { return pattern_node(dfa, false); }
  // Unquoted text `dfa` accepts (a JSON number within bounds); kNoNode when none exists.
  NodeId pattern_number(const ByteDfa& dfa) { return pattern_node(dfa, true); }
  // A node whose definition comes later (for recursive schemas): an anyOf to be filled.
  NodeId placeholder();
  void define(NodeId placeholder, NodeId target);

  // Checks and prepares the grammar with `root` as the whole text. Throws Error when no finite
  // text matches, when the shortest one nests deeper than kMaxFrames, or when alternatives
  // refer to each other without consuming anything (a cycle of bare $refs).
  void finalize(NodeId root);

  // ---- reading --------------------------------------------------------------------------
  NodeId root() const { return root_; }
  const Node& node(NodeId id) const { return nodes_[id]; }
  size_t node_count() const { return nodes_.size(); }
  const SymbolTrie& trie(uint32_t i) const { return tries_[i]; }
  const ObjectShape& shape(uint32_t i) const { return shapes_[i]; }
  const BytePattern& pattern(uint32_t i) const { return patterns_[i]; }
  const ByteDfa& dfa(uint32_t i) const { return dfas_[i]; }
  // Fewest symbols that end a pattern string from automaton state `state`, its closing quote
  // included (kNever for kDead); a bare one takes one less.
  uint64_t dfa_rest(uint32_t i, uint32_t state) const {
    return state == ByteDfa::kDead ? kNever : dfa_rest_[i][state];
  }
  const std::vector<std::string>& specials() const { return specials_; }
  uint32_t min_frames(NodeId id) const { return min_frames_[id]; }
  // Fewest symbols of a text of the node (kNever: none is finite).
  uint64_t min_symbols(NodeId id) const { return min_symbols_[id]; }
  // Whether every text of the node ends its frame for good (a closing quote or bracket): a
  // frame that may only stop (a number, optional DSML parameters, a repeat below its maximum)
  // could read more, so a whole output ending there still needs an end token.
  bool closes(NodeId id) const { return closes_[id] != 0; }
  // Fewest tokens of a text of the node as the end of the output: one per symbol (every byte
  // is a token) plus the end token where the text could go on. Of the root: the fewest tokens
  // of a complete output, what max_tokens must allow.
  uint64_t min_ending(NodeId id) const { return min_ending_[id]; }
  uint64_t min_output_tokens() const { return min_ending_[root_]; }
  // Bytes held (for the schema cache's accounting).
  size_t memory_bytes() const;

 private:
  NodeId add(Node n);
  NodeId pattern_node(const ByteDfa& dfa, bool bare);
  void compute_min_symbols();
  uint32_t add_pattern(std::string_view forbid);
  std::vector<Node> nodes_;
  std::vector<SymbolTrie> tries_;
  std::vector<ObjectShape> shapes_;
  std::vector<BytePattern> patterns_;
  std::vector<ByteDfa> dfas_;
  std::vector<std::vector<uint64_t>> dfa_rest_;
  std::vector<std::string> specials_;
  std::vector<uint32_t> min_frames_;
  std::vector<uint64_t> min_symbols_;
  std::vector<uint8_t> closes_;
  std::vector<uint64_t> min_ending_;
  NodeId root_ = kNoNode;
};

// ---- recognition --------------------------------------------------------------------------

struct Frame {
  NodeId node;
  uint32_t state;
  uint32_t aux;
  friend bool operator==(const Frame&, const Frame&) = default;
  friend auto operator<=>(const Frame&, const Frame&) = default;
};
using Stack = std::vector<Frame>;
// A canonical set of stacks (sorted, unique, at most kMaxStacks). The empty stack means the
// text is complete.
using StackSet = std::vector<Stack>;

// Where recognition starts: the root entered, before any symbol.
StackSet initial_stacks(const Grammar& g);
// The set after reading `s` (empty: `s` cannot come next).
StackSet advance(const Grammar& g, const StackSet& set, Symbol s);
// Whether the text may end here (some stack can finish without reading more).
bool can_end(const Grammar& g, const StackSet& set);
// Whether nothing at all may follow (the set is just the complete empty stack).
bool is_complete(const StackSet& set);
// Tokens a complete output still needs from here, at least one per symbol (every byte is a
// token) plus the end token where the text could go on: 0 when complete. The counted path
// exists: some symbol leads to a set that needs one token less (or is complete), so
// restricting each step to tokens after which this fits the tokens left always finishes.
uint64_t tokens_to_finish(const Grammar& g, const StackSet& set);

// Flat encoding of a set (for hashing and interning) and back.
void encode_stacks(const StackSet& set, std::vector<uint32_t>& out);
StackSet decode_stacks(std::span<const uint32_t> key);

}  // namespace dsv4::constrain
