// Pattern -> syntax tree -> NFA over UTF-8 bytes (Thompson) -> DFA (subset construction) ->
// trimmed. Code point ranges become byte-range sequences by the usual UTF-8 split, so the
// automata only ever accept valid UTF-8 (surrogates excluded).

#include "dsv4/constrain/regex.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

namespace dsv4::constrain {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxNfaStates = 200000;
constexpr uint32_t kMaxRepeat = 1000;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point intervals, inclusive

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.push_back({lo, hi});
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

const Ranges& digit_ranges() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word_ranges() {
  static const Ranges r = normalized({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
  return r;
}
// ECMA-262 WhiteSpace and LineTerminator.
const Ranges& space_ranges() {
  static const Ranges r = normalized({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                      {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                      {0xFEFF, 0xFEFF}});
  return r;
}
const Ranges& dot_ranges() {  // everything but the line terminators
  static const Ranges r = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
  return r;
}

struct Ast {
  enum Kind { kSet, kConcat, kAlt, kRepeat, kStart, kEnd } kind = kConcat;
  Ranges set;
  std::vector<Ast> children;
  uint32_t min = 1, max = 1;  // repeat; max UINT32_MAX: unbounded
};
constexpr uint32_t kInfinite = std::numeric_limits<uint32_t>::max();

class Parser {
 public:
  explicit Parser(std::string_view pattern) {
    for (size_t i = 0; i < pattern.size();) {
      const auto b = static_cast<uint8_t>(pattern[i]);
      const int len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
      if (len == 0 || i + len > pattern.size()) fail("the pattern is not valid UTF-8");
      uint32_t cp = len == 1 ? b : b & (0x7F >> len);
      for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(pattern[i + k]) & 0x3F);
      cp_.push_back(cp);
      i += len;
    }
  }

  Ast parse() {
    Ast a = alternation();
    if (pos_ < cp_.size()) fail("unbalanced ')' at position {}", pos_);
    return a;
  }

 private:
  bool more() const { return pos_ < cp_.size(); }
  uint32_t peek(size_t ahead = 0) const { return pos_ + ahead < cp_.size() ? cp_[pos_ + ahead] : 0xFFFFFFFF; }
  uint32_t take() {
    if (!more()) fail("the pattern ends in the middle of an element");
    return cp_[pos_++];
  }

  Ast alternation() {
    std::vector<Ast> branches;
    branches.push_back(concatenation());
    while (more() && peek() == '|') {
      ++pos_;
      branches.push_back(concatenation());
    }
    if (branches.size() == 1) return std::move(branches[0]);
    Ast a;
    a.kind = Ast::kAlt;
    a.children = std::move(branches);
    return a;
  }

  Ast concatenation() {
    Ast seq;
    while (more() && peek() != '|' && peek() != ')') {
      Ast atom_node = atom();
      quantify(atom_node);
      seq.children.push_back(std::move(atom_node));
    }
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    return seq;
  }

  // A quantifier {n}, {n,}, {n,m} at the current position (without consuming it on failure).
  bool braces(uint32_t& lo, uint32_t& hi) {
    size_t p = pos_ + 1;
    auto number = [&](uint32_t& out) {
      size_t start = p;
      uint64_t v = 0;
      while (p < cp_.size() && cp_[p] >= '0' && cp_[p] <= '9') v = std::min<uint64_t>(v * 10 + (cp_[p++] - '0'), 1u << 30);
      out = static_cast<uint32_t>(v);
      return p > start;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (p < cp_.size() && cp_[p] == ',') {
      ++p;
      if (!number(hi)) hi = kInfinite;
    }
    if (p >= cp_.size() || cp_[p] != '}') return false;
    pos_ = p + 1;
    return true;
  }

  void quantify(Ast& a) {
    while (more()) {
      uint32_t lo, hi;
      const uint32_t c = peek();
      if (c == '*') lo = 0, hi = kInfinite, ++pos_;
      else if (c == '+') lo = 1, hi = kInfinite, ++pos_;
      else if (c == '?') lo = 0, hi = 1, ++pos_;
      else if (c == '{' && braces(lo, hi)) {
        if (lo > hi) fail("the quantifier {{{},{}}} has its bounds reversed", lo, hi);
      } else {
        return;
      }
      if (a.kind == Ast::kStart || a.kind == Ast::kEnd) fail("an anchor cannot be repeated");
      if (lo > kMaxRepeat || (hi != kInfinite && hi > kMaxRepeat))
        fail("repetition counts above {} are not supported", kMaxRepeat);
      if (more() && peek() == '?') ++pos_;  // lazy: matches the same strings
      Ast r;
      r.kind = Ast::kRepeat;
      r.min = lo;
      r.max = hi;
      r.children.push_back(std::move(a));
      a = std::move(r);
    }
  }

  static Ast set(Ranges r) {
    Ast a;
    a.kind = Ast::kSet;
    a.set = normalized(std::move(r));
    return a;
  }

  Ast atom() {
    const uint32_t c = take();
    switch (c) {
      case '(': {
        if (peek() == '?') {
          if (peek(1) == ':') {
            pos_ += 2;
          } else if (peek(1) == '=' || peek(1) == '!') {
            fail("look-ahead (?{}…) is not supported", char(peek(1)));
          } else if (peek(1) == '<' && (peek(2) == '=' || peek(2) == '!')) {
            fail("look-behind (?<{}…) is not supported", char(peek(2)));
          } else if (peek(1) == '<') {
            pos_ += 2;
            while (more() && peek() != '>') ++pos_;
            if (!more()) fail("a group name is not closed with '>'");
            ++pos_;
          } else {
            fail("unknown group (?{}", more() ? std::string(1, char(peek(1))) : std::string());
          }
        }
        Ast inner = alternation();
        if (!more() || take() != ')') fail("a group is not closed with ')'");
        return inner;
      }
      case '[': return set(char_class());
      case '.': return set(dot_ranges());
      case '^': {
        Ast a;
        a.kind = Ast::kStart;
        return a;
      }
      case '$': {
        Ast a;
        a.kind = Ast::kEnd;
        return a;
      }
      case '*':
      case '+':
      case '?': fail("'{}' has nothing to repeat", char(c));
      case '\\': {
        Ranges r;
        escape(false, r);
        return set(std::move(r));
      }
      default: return set({{c, c}});
    }
  }

  uint32_t hex_digits(int count) {
    uint32_t v = 0;
    for (int i = 0; i < count; ++i) {
      const uint32_t h = take();
      int d = h >= '0' && h <= '9' ? int(h - '0') : h >= 'a' && h <= 'f' ? int(h - 'a' + 10) : h >= 'A' && h <= 'F' ? int(h - 'A' + 10) : -1;
      if (d < 0) fail("a \\x or \\u escape needs hexadecimal digits");
      v = v * 16 + uint32_t(d);
    }
    return v;
  }

  // After a backslash: the set it stands for in `out`. Returns true for class escapes.
  bool escape(bool in_class, Ranges& out) {
    const uint32_t c = take();
    auto one = [&](uint32_t cp) {
      out = {{cp, cp}};
      return false;
    };
    switch (c) {
      case 'd': out = digit_ranges(); return true;
      case 'D': out = complement(digit_ranges()); return true;
      case 'w': out = word_ranges(); return true;
      case 'W': out = complement(word_ranges()); return true;
      case 's': out = space_ranges(); return true;
      case 'S': out = complement(space_ranges()); return true;
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'b':
        if (in_class) return one('\b');
        fail("the word boundary \\b is not supported");
      case 'B': fail("the word boundary \\B is not supported");
      case '0':
        if (peek() >= '0' && peek() <= '9') fail("octal escapes are not supported");
        return one(0);
      case 'x': return one(hex_digits(2));
      case 'u': {
        if (peek() == '{') {
          ++pos_;
          uint32_t v = 0;
          int n = 0;
          while (more() && peek() != '}') {
            v = std::min<uint32_t>(v * 16 + hex_digits(1), kMaxCodePoint + 1);
            ++n;
          }
          if (!more() || n == 0) fail("a \\u{{…}} escape is not closed");
          ++pos_;
          if (v > kMaxCodePoint) fail("\\u{{…}} names a code point above U+10FFFF");
          return one(v);
        }
        uint32_t v = hex_digits(4);
        if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
          const size_t save = pos_;
          pos_ += 2;
          const uint32_t low = hex_digits(4);
          if (low >= 0xDC00 && low <= 0xDFFF) return one(0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00));
          pos_ = save;
        }
        return one(v);
      }
      case 'c': {
        const uint32_t l = take();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) fail("\\c must be followed by a letter");
        return one(l % 32);
      }
      case 'k':
        if (peek() == '<') fail("the backreference \\k<…> is not supported");
        fail("unknown escape \\k");
      default:
        if (c >= '1' && c <= '9') fail("the backreference \\{} is not supported", char(c));
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail("unknown escape \\{}", char(c));
        return one(c);  // an escaped syntax character (or any other symbol)
    }
  }

  Ranges char_class() {
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges items;
    while (true) {
      if (!more()) fail("a character class is not closed with ']'");
      if (peek() == ']') {
        ++pos_;
        break;
      }
      Ranges first;
      bool first_is_class = false;
      const uint32_t c = take();
      if (c == '\\') first_is_class = escape(true, first);
      else first = {{c, c}};
      if (!first_is_class && peek() == '-' && peek(1) != ']' && peek(1) != 0xFFFFFFFF) {
        ++pos_;
        Ranges last;
        const uint32_t d = take();
        bool last_is_class = false;
        if (d == '\\') last_is_class = escape(true, last);
        else last = {{d, d}};
        if (last_is_class) fail("a class escape cannot end a range");
        if (last[0].first < first[0].first) fail("the class range is out of order");
        items.push_back({first[0].first, last[0].first});
        continue;
      }
      items.insert(items.end(), first.begin(), first.end());
    }
    return negate ? complement(items) : normalized(items);
  }

  std::vector<uint32_t> cp_;
  size_t pos_ = 0;
};

// ---- NFA ---------------------------------------------------------------------------------

struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    uint32_t to;
  };
  std::vector<std::vector<Edge>> edges;
  std::vector<std::vector<uint32_t>> eps;
  uint32_t accept = 0;

  uint32_t add() {
    if (edges.size() >= kMaxNfaStates) fail("the pattern is too large (more than {} automaton states)", kMaxNfaStates);
    edges.emplace_back();
    eps.emplace_back();
    return static_cast<uint32_t>(edges.size() - 1);
  }
};

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t* out) {
  const int n = utf8_length(cp);
  if (n == 1) {
    out[0] = uint8_t(cp);
    return;
  }
  for (int i = n - 1; i > 0; --i) {
    out[i] = uint8_t(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = uint8_t((0xF00 >> n) | cp);
}

// Splits [lo, hi] into ranges whose UTF-8 forms are sequences of byte ranges.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

void check_no_anchor(const Ast& a) {
  if (a.kind == Ast::kStart) fail("the anchor ^ is only supported at the start of the pattern or of an alternative");
  if (a.kind == Ast::kEnd) fail("the anchor $ is only supported at the end of the pattern or of an alternative");
  for (const Ast& c : a.children) check_no_anchor(c);
}

uint32_t build(Nfa& nfa, const Ast& a, uint32_t in) {
  switch (a.kind) {
    case Ast::kSet: {
      const uint32_t out = nfa.add();
      std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
      for (const auto& [lo, hi] : a.set) utf8_sequences(lo, hi, seqs);
      for (const auto& seq : seqs) {
        uint32_t at = in;
        for (size_t i = 0; i < seq.size(); ++i) {
          const uint32_t to = i + 1 == seq.size() ? out : nfa.add();
          nfa.edges[at].push_back({seq[i].first, seq[i].second, to});
          at = to;
        }
      }
      return out;
    }
    case Ast::kConcat:
      for (const Ast& c : a.children) in = build(nfa, c, in);
      return in;
    case Ast::kAlt: {
      const uint32_t out = nfa.add();
      for (const Ast& c : a.children) {
        const uint32_t s = nfa.add();
        nfa.eps[in].push_back(s);
        nfa.eps[build(nfa, c, s)].push_back(out);
      }
      return out;
    }
    case Ast::kRepeat: {
      const Ast& c = a.children[0];
      for (uint32_t i = 0; i < a.min; ++i) in = build(nfa, c, in);
      if (a.max == kInfinite) {
        const uint32_t loop = nfa.add();
        nfa.eps[in].push_back(loop);
        nfa.eps[build(nfa, c, loop)].push_back(loop);
        return loop;
      }
      const uint32_t out = nfa.add();
      for (uint32_t i = a.min; i < a.max; ++i) {
        nfa.eps[in].push_back(out);
        in = build(nfa, c, in);
      }
      nfa.eps[in].push_back(out);
      return out;
    }
    case Ast::kStart:
    case Ast::kEnd: check_no_anchor(a);
  }
  return in;
}

// The branches of the top-level alternation, each with its anchors taken off.
void add_branches(const Ast& a, std::vector<std::pair<Ast, std::pair<bool, bool>>>& out) {
  if (a.kind == Ast::kAlt) {
    for (const Ast& c : a.children) add_branches(c, out);
    return;
  }
  std::vector<Ast> parts = a.kind == Ast::kConcat ? a.children : std::vector<Ast>{a};
  bool start = false, end = false;
  while (!parts.empty() && parts.front().kind == Ast::kStart) {
    start = true;
    parts.erase(parts.begin());
  }
  while (!parts.empty() && parts.back().kind == Ast::kEnd) {
    end = true;
    parts.pop_back();
  }
  Ast body;
  body.children = std::move(parts);
  check_no_anchor(body);
  out.push_back({std::move(body), {start, end}});
}

// ---- DFA ---------------------------------------------------------------------------------

ByteDfa determinize(const Nfa& nfa, uint32_t start, uint32_t max_states) {
  std::array<bool, 257> cut{};
  for (const auto& list : nfa.edges)
    for (const Nfa::Edge& e : list) {
      cut[e.lo] = true;
      cut[size_t(e.hi) + 1] = true;
    }
  ByteDfa d;
  std::vector<uint8_t> representative;
  uint32_t cls = 0;
  for (int b = 0; b < 256; ++b) {
    if (b > 0 && cut[b]) ++cls;
    if (representative.size() <= cls) representative.push_back(uint8_t(b));
    d.byte_class[b] = uint8_t(cls);
  }
  d.classes = cls + 1;

  std::vector<uint32_t> mark(nfa.edges.size(), 0);
  uint32_t stamp = 0;
  auto closure = [&](std::vector<uint32_t> set) {
    ++stamp;
    std::vector<uint32_t> todo = set;
    for (uint32_t s : set) mark[s] = stamp;
    while (!todo.empty()) {
      const uint32_t s = todo.back();
      todo.pop_back();
      for (uint32_t t : nfa.eps[s])
        if (mark[t] != stamp) {
          mark[t] = stamp;
          set.push_back(t);
          todo.push_back(t);
        }
    }
    std::sort(set.begin(), set.end());
    return set;
  };
  std::map<std::vector<uint32_t>, uint32_t> ids;
  std::vector<std::vector<uint32_t>> sets;
  auto intern = [&](std::vector<uint32_t> set) {
    if (set.empty()) return ByteDfa::kDead;
    auto [it, fresh] = ids.emplace(set, static_cast<uint32_t>(sets.size()));
    if (fresh) {
      if (sets.size() >= max_states || (sets.size() + 1) * d.classes > kMaxDfaEntries)
        fail("the pattern is too complex (its automaton would exceed {} states or {} MiB)", max_states,
             kMaxDfaEntries * 4 >> 20);
      sets.push_back(std::move(set));
    }
    return it->second;
  };
  d.start = intern(closure({start}));
  for (size_t i = 0; i < sets.size(); ++i) {
    d.accept.push_back(std::binary_search(sets[i].begin(), sets[i].end(), nfa.accept) ? 1 : 0);
    for (uint32_t c = 0; c < d.classes; ++c) {
      const uint8_t b = representative[c];
      std::vector<uint32_t> next;
      for (uint32_t s : sets[i])
        for (const Nfa::Edge& e : nfa.edges[s])
          if (e.lo <= b && b <= e.hi) next.push_back(e.to);
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      const uint32_t to = next.empty() ? ByteDfa::kDead : intern(closure(std::move(next)));
      d.table.push_back(to);
    }
  }
  return d;
}

// Keeps the states reachable from the start that can still reach an accepting state,
// numbered in breadth-first order from the start, with byte classes merged where equal.
ByteDfa trim(const ByteDfa& a) {
  const uint32_t n = a.size();
  std::vector<std::vector<uint32_t>> back(n);
  for (uint32_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < a.classes; ++c) {
      const uint32_t t = a.table[size_t(s) * a.classes + c];
      if (t != ByteDfa::kDead) back[t].push_back(s);
    }
  std::vector<uint8_t> live(n, 0);
  std::vector<uint32_t> todo;
  for (uint32_t s = 0; s < n; ++s)
    if (a.accept[s]) live[s] = 1, todo.push_back(s);
  while (!todo.empty()) {
    const uint32_t s = todo.back();
    todo.pop_back();
    for (uint32_t p : back[s])
      if (!live[p]) live[p] = 1, todo.push_back(p);
  }
  ByteDfa out;
  if (a.start == ByteDfa::kDead || !live[a.start]) return out;  // matches nothing
  std::vector<uint32_t> id(n, ByteDfa::kDead);
  std::vector<uint32_t> order = {a.start};
  id[a.start] = 0;
  for (size_t i = 0; i < order.size(); ++i)
    for (uint32_t c = 0; c < a.classes; ++c) {
      const uint32_t t = a.table[size_t(order[i]) * a.classes + c];
      if (t != ByteDfa::kDead && live[t] && id[t] == ByteDfa::kDead) {
        id[t] = static_cast<uint32_t>(order.size());
        order.push_back(t);
      }
    }
  // Classes that now lead everywhere alike become one.
  std::map<std::vector<uint32_t>, uint8_t> column_id;
  std::vector<uint8_t> remap(a.classes);
  std::vector<std::vector<uint32_t>> columns;
  for (uint32_t c = 0; c < a.classes; ++c) {
    std::vector<uint32_t> col;
    for (uint32_t s : order) {
      const uint32_t t = a.table[size_t(s) * a.classes + c];
      col.push_back(t == ByteDfa::kDead || !live[t] ? ByteDfa::kDead : id[t]);
    }
    auto [it, fresh] = column_id.emplace(col, static_cast<uint8_t>(columns.size()));
    if (fresh) columns.push_back(std::move(col));
    remap[c] = it->second;
  }
  out.start = 0;
  out.classes = static_cast<uint32_t>(columns.size());
  for (int b = 0; b < 256; ++b) out.byte_class[b] = remap[a.byte_class[b]];
  out.table.resize(size_t(order.size()) * out.classes);
  for (size_t i = 0; i < order.size(); ++i) {
    out.accept.push_back(a.accept[order[i]]);
    for (uint32_t c = 0; c < out.classes; ++c) out.table[i * out.classes + c] = columns[c][i];
  }
  return out;
}

// A product over a refinement of the byte classes: `key(b)` says which bytes stay together.
template <class Key, class Step, class Accept>
ByteDfa product(const ByteDfa& a, Key key, uint64_t start, Step step, Accept accept, const char* what,
                uint32_t max_states = kMaxDfaStates) {
  ByteDfa d;
  std::map<std::pair<uint32_t, uint32_t>, uint8_t> classes;
  std::vector<uint8_t> representative;
  for (int b = 0; b < 256; ++b) {
    auto [it, fresh] = classes.emplace(std::pair<uint32_t, uint32_t>{a.byte_class[b], key(uint8_t(b))},
                                       static_cast<uint8_t>(representative.size()));
    if (fresh) representative.push_back(uint8_t(b));
    d.byte_class[b] = it->second;
  }
  d.classes = static_cast<uint32_t>(representative.size());
  std::map<uint64_t, uint32_t> ids;
  std::vector<uint64_t> states;
  auto intern = [&](uint64_t s) {
    if (s == ~uint64_t{0}) return ByteDfa::kDead;
    auto [it, fresh] = ids.emplace(s, static_cast<uint32_t>(states.size()));
    if (fresh) {
      if (states.size() >= max_states || (states.size() + 1) * d.classes > kMaxDfaEntries)
        fail("{} is too complex to enforce (its automaton would exceed {} states or {} MiB)", what, max_states,
             kMaxDfaEntries * 4 >> 20);
      states.push_back(s);
    }
    return it->second;
  };
  d.start = intern(start);
  for (size_t i = 0; i < states.size(); ++i) {
    d.accept.push_back(accept(states[i]) ? 1 : 0);
    for (uint32_t c = 0; c < d.classes; ++c) d.table.push_back(intern(step(states[i], representative[c])));
  }
  return trim(d);
}

}  // namespace

ByteDfa regex_dfa(std::string_view pattern, uint32_t max_states) {
  const Ast tree = Parser(pattern).parse();
  std::vector<std::pair<Ast, std::pair<bool, bool>>> branches;
  add_branches(tree, branches);
  Ast any;
  any.kind = Ast::kRepeat;
  any.min = 0;
  any.max = kInfinite;
  Ast every;
  every.kind = Ast::kSet;
  every.set = {{0, kMaxCodePoint}};
  any.children.push_back(every);
  Nfa nfa;
  const uint32_t start = nfa.add();
  nfa.accept = nfa.add();
  for (const auto& [body, anchors] : branches) {
    uint32_t at = nfa.add();
    nfa.eps[start].push_back(at);
    if (!anchors.first) at = build(nfa, any, at);
    at = build(nfa, body, at);
    if (!anchors.second) at = build(nfa, any, at);
    nfa.eps[at].push_back(nfa.accept);
  }
  ByteDfa d = trim(determinize(nfa, start, max_states));
  if (d.start == ByteDfa::kDead) fail("the pattern matches no string");
  return d;
}

ByteDfa intersect(const ByteDfa& a, const ByteDfa& b, uint32_t max_states) {
  if (a.start == ByteDfa::kDead || b.start == ByteDfa::kDead) return {};
  auto pack = [](uint32_t x, uint32_t y) {
    return x == ByteDfa::kDead || y == ByteDfa::kDead ? ~uint64_t{0} : (uint64_t{x} << 32) | y;
  };
  return product(
      a, [&](uint8_t byte) { return b.byte_class[byte]; }, pack(a.start, b.start),
      [&](uint64_t s, uint8_t byte) { return pack(a.step(uint32_t(s >> 32), byte), b.step(uint32_t(s), byte)); },
      [&](uint64_t s) { return a.accept[s >> 32] && b.accept[uint32_t(s)]; }, "the pattern with the format", max_states);
}

ByteDfa subtract(const ByteDfa& a, const ByteDfa& b, uint32_t max_states) {
  if (a.start == ByteDfa::kDead || b.start == ByteDfa::kDead) return a;
  // b's side may die (then the text is surely not b's); a's may not.
  constexpr uint32_t kGone = ByteDfa::kDead;
  auto pack = [](uint32_t x, uint32_t y) { return x == ByteDfa::kDead ? ~uint64_t{0} : (uint64_t{x} << 32) | y; };
  return product(
      a, [&](uint8_t byte) { return b.byte_class[byte]; }, pack(a.start, b.start),
      [&](uint64_t s, uint8_t byte) {
        const uint32_t y = uint32_t(s);
        return pack(a.step(uint32_t(s >> 32), byte), y == kGone ? kGone : b.step(y, byte));
      },
      [&](uint64_t s) { return a.accept[s >> 32] && !(uint32_t(s) != kGone && b.accept[uint32_t(s)]); },
      "the values \"not\" excludes", max_states);
}

ByteDfa literal_set_dfa(const std::vector<std::string>& texts) {
  // A trie; bytes that no text uses share one class.
  ByteDfa d;
  d.byte_class.fill(0);
  uint32_t classes = 1;
  for (const std::string& t : texts)
    for (char c : t)
      if (d.byte_class[uint8_t(c)] == 0) {
        if (classes == 255) fail("the texts use too many distinct bytes");
        d.byte_class[uint8_t(c)] = static_cast<uint8_t>(classes++);
      }
  d.classes = classes;
  d.start = 0;
  d.accept = {0};
  d.table.assign(classes, ByteDfa::kDead);
  for (const std::string& t : texts) {
    uint32_t at = 0;
    for (char c : t) {
      uint32_t& next = d.table[size_t(at) * classes + d.byte_class[uint8_t(c)]];
      if (next == ByteDfa::kDead) {
        if ((d.accept.size() + 1) * classes > kMaxDfaEntries) fail("the texts are too many to enforce");
        next = d.size();
        d.accept.push_back(0);
        d.table.resize(d.table.size() + classes, ByteDfa::kDead);
      }
      at = d.table[size_t(at) * classes + d.byte_class[uint8_t(c)]];
    }
    d.accept[at] = 1;
  }
  return trim(d);
}

ByteDfa bound_length(const ByteDfa& a, uint32_t min_chars, uint32_t max_chars, uint32_t max_states) {
  if (a.start == ByteDfa::kDead) return {};
  const bool bounded = max_chars != std::numeric_limits<uint32_t>::max();
  const uint32_t cap = bounded ? max_chars : min_chars;
  auto leading = [](uint8_t b) { return b < 0x80 || b >= 0xC0; };  // starts a character
  return product(
      a, [&](uint8_t byte) { return leading(byte) ? 1u : 0u; }, uint64_t{a.start} << 32,
      [&](uint64_t s, uint8_t byte) {
        const uint32_t t = a.step(uint32_t(s >> 32), byte);
        uint32_t count = uint32_t(s);
        if (leading(byte)) {
          if (bounded && count >= max_chars) return ~uint64_t{0};
          count = std::min(count + 1, cap);
        }
        return t == ByteDfa::kDead ? ~uint64_t{0} : (uint64_t{t} << 32) | count;
      },
      [&](uint64_t s) { return a.accept[s >> 32] && uint32_t(s) >= min_chars; }, "the pattern with minLength/maxLength", max_states);
}

ByteDfa excluding(const ByteDfa& a, std::string_view forbidden) {
  if (forbidden.empty() || a.start == ByteDfa::kDead) return a;
  // Nothing to do when no state reads the forbidden text's first byte.
  bool reads_first = false;
  for (uint32_t s = 0; s < a.size() && !reads_first; ++s)
    reads_first = a.step(s, static_cast<uint8_t>(forbidden[0])) != ByteDfa::kDead;
  if (!reads_first) return a;
  // The forbidden text's matching automaton (KMP): progress 0..m-1, m = found.
  const uint32_t m = static_cast<uint32_t>(forbidden.size());
  auto next = [&](uint32_t progress, uint8_t byte) {
    while (true) {
      if (static_cast<uint8_t>(forbidden[progress]) == byte) return progress + 1;
      if (progress == 0) return 0u;
      // The longest proper border of forbidden[0..progress).
      uint32_t k = progress - 1;
      while (k > 0 && forbidden.substr(0, k) != forbidden.substr(progress - k, k)) --k;
      progress = k;
    }
  };
  auto key = [&](uint8_t byte) {
    const size_t at = forbidden.find(static_cast<char>(byte));
    return at == std::string_view::npos ? 0u : uint32_t(at) + 1;
  };
  return product(
      a, key, uint64_t{a.start} << 32,
      [&](uint64_t s, uint8_t byte) {
        const uint32_t t = a.step(uint32_t(s >> 32), byte);
        const uint32_t p = next(uint32_t(s), byte);
        return t == ByteDfa::kDead || p == m ? ~uint64_t{0} : (uint64_t{t} << 32) | p;
      },
      [&](uint64_t s) { return a.accept[s >> 32] != 0; }, "the pattern");
}

ByteDfa writable_in_json(const ByteDfa& a) {
  if (a.start == ByteDfa::kDead) return a;
  auto unwritable = [](uint8_t b) { return b < 0x20 && b != '\b' && b != '\f' && b != '\n' && b != '\r' && b != '\t'; };
  return product(
      a, [&](uint8_t byte) { return unwritable(byte) ? 1u : 0u; }, uint64_t{a.start},
      [&](uint64_t s, uint8_t byte) {
        const uint32_t t = a.step(uint32_t(s), byte);
        return unwritable(byte) || t == ByteDfa::kDead ? ~uint64_t{0} : uint64_t{t};
      },
      [&](uint64_t s) { return a.accept[s] != 0; }, "the pattern");
}

std::string integer_range_pattern(uint64_t lo, uint64_t hi) {
  // Cut lo..hi where the digit count changes or a run of trailing digits can be free: each
  // piece then has lo and hi of one length that differ in a prefix, one digit range, and
  // trailing digits that run 0-9.
  std::vector<uint64_t> stops = {hi};
  auto pow10 = [](int k) {
    uint64_t p = 1;
    for (int i = 0; i < k; ++i) p *= 10;
    return p;
  };
  for (int k = 1; k <= 19; ++k) {  // lo with its last k digits made nines
    const uint64_t p = pow10(k);
    const uint64_t stop = lo / p * p + (p - 1);
    if (stop >= hi || stop < lo) break;
    stops.push_back(stop);
  }
  for (int k = 1; k <= 19; ++k) {  // hi + 1 with its last k digits made zeros, minus one
    const uint64_t p = pow10(k);
    if (hi + 1 < p) break;
    const uint64_t stop = (hi + 1) / p * p - 1;
    if (stop <= lo || stop > hi) continue;
    stops.push_back(stop);
  }
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  std::string out;
  uint64_t start = lo;
  for (uint64_t stop : stops) {
    if (stop < start) continue;
    const std::string a = std::to_string(start), b = std::to_string(stop);
    std::string piece;
    int free_digits = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) piece += a[i];
      else if (a[i] != '0' || b[i] != '9') piece += fmt::format("[{}-{}]", a[i], b[i]);
      else ++free_digits;
    }
    if (free_digits > 0) piece += fmt::format("\\d{{{}}}", free_digits);
    if (!out.empty()) out += '|';
    out += piece;
    start = stop + 1;
  }
  return out;
}

ByteDfa multiples_dfa(uint64_t k, uint32_t max_digits, uint32_t max_states) {
  if (k == 0 || max_digits == 0) fail("multipleOf: k and the digits must be at least 1");
  const uint64_t states = 3 + uint64_t{max_digits} * k;  // start, after "-", "0", then (digits, remainder)
  constexpr uint32_t kClasses = 12;                       // "-", each digit, the rest
  if (states > max_states || states * kClasses > kMaxDfaEntries)
    fail("\"multipleOf\": {} is too large to enforce (its automaton would exceed {} states)", k,
         std::min<uint64_t>(max_states, kMaxDfaEntries / kClasses));
  ByteDfa d;
  d.classes = kClasses;
  d.byte_class.fill(kClasses - 1);
  d.byte_class['-'] = 0;
  for (int c = 0; c < 10; ++c) d.byte_class['0' + c] = static_cast<uint8_t>(1 + c);
  d.table.assign(states * kClasses, ByteDfa::kDead);
  d.accept.assign(states, 0);
  auto at = [&](uint64_t digits, uint64_t remainder) { return static_cast<uint32_t>(3 + (digits - 1) * k + remainder); };
  auto set = [&](uint64_t from, uint32_t cls, uint32_t to) { d.table[from * kClasses + cls] = to; };
  d.start = 0;
  set(0, 0, 1);
  for (uint32_t from : {0u, 1u}) {
    set(from, 1, 2);
    for (uint32_t c = 1; c < 10; ++c) set(from, 1 + c, at(1, c % k));
  }
  d.accept[2] = 1;
  for (uint64_t digits = 1; digits <= max_digits; ++digits)
    for (uint64_t r = 0; r < k; ++r) {
      d.accept[at(digits, r)] = r == 0;
      if (digits < max_digits)
        for (uint32_t c = 0; c < 10; ++c) set(at(digits, r), 1 + c, at(digits + 1, (r * 10 + c) % k));
    }
  return trim(d);
}

bool full_match(const ByteDfa& a, std::string_view text) {
  uint32_t s = a.start;
  for (char c : text) {
    if (s == ByteDfa::kDead) return false;
    s = a.step(s, static_cast<uint8_t>(c));
  }
  return a.accepts(s);
}

namespace {

// The formats as patterns. What they accept is the format's standard grammar, or a part of it
// that validators accept (noted where narrower).
std::string format_pattern(std::string_view format) {
  // RFC 3339 full-date, with February 29 only in leap years.
  const std::string year = "\\d{4}";
  const std::string leap = "(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)";
  const std::string date = "(?:" + year + "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))|" +
                           leap + "-02-29)";
  // RFC 3339 full-time (seconds 00-59: a leap second is valid only at the end of some days).
  const std::string time = "(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:[Zz]|[+-](?:[01]\\d|2[0-3]):[0-5]\\d))";
  const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
  const std::string hostname = label + "(?:\\." + label + ")*";
  const std::string octet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
  const std::string ipv4 = octet + "(?:\\." + octet + "){3}";
  const std::string h16 = "[0-9A-Fa-f]{1,4}";
  const std::string ipv6 = "(?:(?:" + h16 + ":){7}" + h16 + "|(?:" + h16 + ":){1,7}:|(?:" + h16 + ":){1,6}:" + h16 +
                           "|(?:" + h16 + ":){1,5}(?::" + h16 + "){1,2}|(?:" + h16 + ":){1,4}(?::" + h16 + "){1,3}|(?:" +
                           h16 + ":){1,3}(?::" + h16 + "){1,4}|(?:" + h16 + ":){1,2}(?::" + h16 + "){1,5}|" + h16 +
                           ":(?::" + h16 + "){1,6}|:(?:(?::" + h16 + "){1,7}|:))";
  // RFC 3986.
  const std::string unreserved_sub = "A-Za-z0-9\\-._~!$&'()*+,;=";
  const std::string pct = "%[0-9A-Fa-f]{2}";
  const std::string pchar = "(?:[" + unreserved_sub + ":@]|" + pct + ")";
  const std::string authority = "(?:(?:[" + unreserved_sub + ":]|" + pct + ")*@)?(?:[" + unreserved_sub + "]|" + pct +
                                ")*(?::\\d*)?";
  const std::string query = "(?:\\?(?:" + pchar + "|[/?])*)?(?:#(?:" + pchar + "|[/?])*)?";
  const std::string hier = "(?://" + authority + "(?:/" + pchar + "*)*|/?(?:" + pchar + "+(?:/" + pchar + "*)*)?)";
  const std::string uri = "[A-Za-z][A-Za-z0-9+.\\-]*:" + hier + query;
  const std::string nc = "(?:[" + unreserved_sub + "@]|" + pct + ")";  // a first segment without ':'
  const std::string relative = "(?://" + authority + "(?:/" + pchar + "*)*|/(?:" + pchar + "+(?:/" + pchar + "*)*)?|" +
                               nc + "+(?:/" + pchar + "*)*|)" + query;
  const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~\\-]+";
  if (format == "date") return date;
  if (format == "time") return time;
  if (format == "date-time") return date + "[Tt]" + time;
  if (format == "duration")
    return "P(?:\\d+W|(?:\\d+Y(?:\\d+M)?(?:\\d+D)?|\\d+M(?:\\d+D)?|\\d+D)(?:T(?:\\d+H(?:\\d+M)?(?:\\d+S)?|\\d+M(?:\\d+S)?|\\d+S))?|T(?:\\d+H(?:\\d+M)?(?:\\d+S)?|\\d+M(?:\\d+S)?|\\d+S))";
  if (format == "email") return atext + "(?:\\." + atext + ")*@" + hostname;
  if (format == "hostname") return hostname;
  if (format == "ipv4") return ipv4;
  if (format == "ipv6") return ipv6;
  if (format == "uri") return uri;
  if (format == "uri-reference") return "(?:" + uri + "|" + relative + ")";
  if (format == "uuid") return "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}";
  return "";
}

constexpr std::array<std::string_view, 11> kFormats = {"date-time", "date", "time", "duration", "email", "hostname",
                                                       "ipv4", "ipv6", "uri", "uri-reference", "uuid"};

}  // namespace

bool known_format(std::string_view format) {
  return std::find(kFormats.begin(), kFormats.end(), format) != kFormats.end();
}

const ByteDfa& format_dfa(std::string_view format) {
  // Built once per process (hostname's 253-character bound alone is ~28k states, ~20 ms), then
  // only read.
  static const std::array<ByteDfa, kFormats.size()> automata = [] {
    std::array<ByteDfa, kFormats.size()> out;
    for (size_t i = 0; i < kFormats.size(); ++i) {
      out[i] = regex_dfa("^(?:" + format_pattern(kFormats[i]) + ")$");
      if (kFormats[i] == "hostname") out[i] = bound_length(out[i], 1, 253);  // RFC 1123: 253 characters in all
    }
    return out;
  }();
  const auto it = std::find(kFormats.begin(), kFormats.end(), format);
  if (it == kFormats.end()) fail("unknown format \"{}\"", format);
  return automata[size_t(it - kFormats.begin())];
}

}  // namespace dsv4::constrain
