// Recognition: the stack sets that step a Grammar (grammar.cc builds it) along symbols,
// and their encoding as cache keys.

#include "dsv4/constrain/grammar.h"

#include <algorithm>

#include "dsv4/util/error.h"

namespace dsv4::constrain {

namespace {

constexpr Symbol kEnd = 0xFFFF;  // "the text ends here" (never a real symbol)

bool is_ws(Symbol s) { return s == ' ' || s == '\n' || s == '\t' || s == '\r'; }
bool is_digit(Symbol s) { return s >= '0' && s <= '9'; }
bool is_hex(Symbol s) { return is_digit(s) || (s >= 'a' && s <= 'f') || (s >= 'A' && s <= 'F'); }

// UTF-8 decoding state: 0 between characters; 1-3 continuation bytes still needed; 4-7 the
// first continuation byte has a narrower range (E0, ED, F0, F4 leads). -1: invalid.
int utf8_next(uint32_t st, uint8_t b) {
  auto in = [b](int lo, int hi) { return b >= lo && b <= hi; };
  switch (st) {
    case 0:
      if (b < 0x80) return 0;
      if (in(0xC2, 0xDF)) return 1;
      if (b == 0xE0) return 4;
      if (in(0xE1, 0xEC) || b == 0xEE || b == 0xEF) return 2;
      if (b == 0xED) return 5;
      if (b == 0xF0) return 6;
      if (in(0xF1, 0xF3)) return 3;
      if (b == 0xF4) return 7;
      return -1;
    case 1: return in(0x80, 0xBF) ? 0 : -1;
    case 2: return in(0x80, 0xBF) ? 1 : -1;
    case 3: return in(0x80, 0xBF) ? 2 : -1;
    case 4: return in(0xA0, 0xBF) ? 1 : -1;
    case 5: return in(0x80, 0x9F) ? 1 : -1;
    case 6: return in(0x90, 0xBF) ? 2 : -1;
    case 7: return in(0x80, 0x8F) ? 2 : -1;
  }
  return -1;
}

// Bit fields of Frame::state, per node kind.
struct Bits {
  uint32_t shift, width;
  uint32_t get(uint32_t v) const { return (v >> shift) & ((1u << width) - 1); }
  uint32_t set(uint32_t v, uint32_t x) const {
    const uint32_t m = ((1u << width) - 1) << shift;
    return (v & ~m) | ((x << shift) & m);
  }
};
// string: phase, utf8, pattern progress, position in the declared names (free keys)
constexpr Bits kStrPhase{0, 5}, kStrUtf8{5, 3}, kStrPat{8, 4}, kStrName{12, 20};
constexpr uint32_t kNameOff = (1u << 20) - 1;
// raw text / until: utf8, pattern progress, held-back bytes of "</" (0-2), finished
constexpr Bits kRawUtf8{0, 3}, kRawPat{3, 4}, kRawHeld{7, 2}, kRawDone{9, 1};
// number: phase, digits in the current part
constexpr Bits kNumPhase{0, 4}, kNumDigits{4, 5};
// array: phase, whitespace run
constexpr Bits kArrPhase{0, 3}, kArrWs{3, 5};
// object: phase, whitespace run, index of the next property that may be written
constexpr Bits kObjPhase{0, 4}, kObjWs{4, 5}, kObjNext{9, 12};
constexpr uint32_t kFreeKey = std::numeric_limits<uint32_t>::max();

enum StrPhase : uint32_t {
  kSOpen, kSBody, kSEsc, kSU1, kSU2, kSU2D, kSU3, kSU3H, kSU4, kSU4H,
  kSLow0, kSLow1, kSLow2, kSLow3, kSLow4, kSLow5, kSDone
};
enum NumPhase : uint32_t { kNStart, kNMinus, kNZero, kNInt, kNDot, kNFrac, kNE, kNESign, kNExp };
enum ArrPhase : uint32_t { kAOpen, kAFirst, kAAfter, kAComma, kADone };
enum ObjPhase : uint32_t { kOOpen, kOFirst, kOKey, kOColon, kOValue, kOAfter, kOSep, kODone };
enum RepPhase : uint32_t { kRWant, kRAfter, kRSep };
// pattern string: state = phase, aux = automaton state
enum PatPhase : uint32_t { kPOpen, kPBody, kPEscape, kPDone };

// Length counters stop at the largest value any check looks at, so texts that differ only in
// an unbounded length share states.
uint32_t bump(uint32_t count, const Node& n) {
  const uint32_t cap = n.max != kUnbounded ? n.max : n.min;
  return count < cap ? count + 1 : cap;
}
bool room(uint32_t count, const Node& n) { return n.max == kUnbounded || count < n.max; }

// Bytes that finish a UTF-8 character from each decoding state (see utf8_next).
constexpr uint8_t kUtf8Left[8] = {0, 1, 2, 3, 2, 2, 3, 3};

uint64_t add_sat(uint64_t a, uint64_t b) { return std::min(a + b, kNever); }
uint64_t mul_sat(uint64_t a, uint64_t k) { return k == 0 ? 0 : a >= kNever / k ? kNever : std::min(a * k, kNever); }

class Walker {
 public:
  Walker(const Grammar& g, StackSet& out) : g_(g), out_(out) {}

  // Fewest symbols that finish the stack: the top frame from where it is, each frame below
  // from where it will be once the frame above it is done.
  uint64_t symbols_to_finish(const Stack& st) const {
    uint64_t total = 0;
    for (size_t i = 0; i < st.size(); ++i) {
      Frame f = st[i];
      if (i + 1 < st.size()) {
        child_done_frame(f);
        if (done(f)) continue;
      }
      total = add_sat(total, rest(f));
    }
    return total;
  }

  void feed(Stack st, Symbol s) {
    if (st.empty()) {
      if (s == kEnd) out_.push_back(std::move(st));
      return;
    }
    const Frame f = st.back();
    if (may_stop(f)) {
      // Alternative: this frame ends here and its parent reads `s`.
      Stack parent = st;
      parent.pop_back();
      child_done(parent);
      feed(std::move(parent), s);
    }
    consume(std::move(st), s);
  }

  // Pushes `c` (each alternative of an anyOf separately) in its initial state, then feeds `s`.
  void enter(const Stack& st, NodeId c, Symbol s) {
    const Node& n = g_.node(c);
    if (n.kind == NodeKind::kAnyOf) {
      for (NodeId alt : n.children) enter(st, alt, s);
      return;
    }
    if (st.size() + g_.min_frames(c) > kMaxFrames) return;
    Stack next = st;
    next.push_back(initial_frame(c));
    feed(std::move(next), s);
  }

  // The initial frames of `c` on top of `st`, without reading anything.
  void expand(const Stack& st, NodeId c) {
    const Node& n = g_.node(c);
    if (n.kind == NodeKind::kAnyOf) {
      for (NodeId alt : n.children) expand(st, alt);
      return;
    }
    if (st.size() + g_.min_frames(c) > kMaxFrames) return;
    Stack next = st;
    next.push_back(initial_frame(c));
    out_.push_back(std::move(next));
  }

 private:
  Frame initial_frame(NodeId c) const {
    const Node& n = g_.node(c);
    Frame f{c, 0, 0};
    if (n.kind == NodeKind::kObject && g_.shape(n.index).syntax == ObjectSyntax::kDsml) f.state = kObjPhase.set(0, kOFirst);
    if (n.kind == NodeKind::kPattern && n.bare) f = Frame{c, kPBody, g_.dfa(n.index).start};
    return f;
  }

  // A frame that cannot read anything more.
  bool done(const Frame& f) const {
    const Node& n = g_.node(f.node);
    switch (n.kind) {
      case NodeKind::kLiteral: {
        const SymbolTrie& t = g_.trie(n.index);
        return t.terminal(f.state) && !t.has_children(f.state);
      }
      case NodeKind::kString: return kStrPhase.get(f.state) == kSDone;
      case NodeKind::kPattern: return f.state == kPDone;
      case NodeKind::kRawText:
      case NodeKind::kUntil: return kRawDone.get(f.state) != 0;
      case NodeKind::kNumber: {
        const uint32_t ph = kNumPhase.get(f.state), d = kNumDigits.get(f.state);
        if (ph == kNExp) return d >= kMaxExpDigits;
        if (n.integer) return ph == kNZero || (ph == kNInt && d >= kMaxIntDigits);
        return false;
      }
      case NodeKind::kArray: return kArrPhase.get(f.state) == kADone;
      case NodeKind::kObject: return kObjPhase.get(f.state) == kODone;
      case NodeKind::kSeq: return f.state >= n.children.size();
      case NodeKind::kRepeat: return f.state == kRAfter && f.aux >= n.max;
      case NodeKind::kAnyOf: break;
    }
    return false;
  }

  // A frame that may end here (it could also read more).
  bool may_stop(const Frame& f) const {
    if (done(f)) return true;
    const Node& n = g_.node(f.node);
    switch (n.kind) {
      case NodeKind::kLiteral: return g_.trie(n.index).terminal(f.state);
      case NodeKind::kNumber: {
        const uint32_t ph = kNumPhase.get(f.state);
        return ph == kNZero || ph == kNInt || ph == kNFrac || ph == kNExp;
      }
      case NodeKind::kObject: {
        const ObjectShape& sh = g_.shape(n.index);
        const uint32_t ph = kObjPhase.get(f.state);
        return sh.syntax == ObjectSyntax::kDsml && (ph == kOFirst || ph == kOAfter) &&
               sh.next_required[kObjNext.get(f.state)] == sh.properties.size();
      }
      case NodeKind::kRepeat:
        return (f.state == kRAfter && f.aux >= n.min) || (f.state == kRWant && f.aux == 0 && n.min == 0);
      case NodeKind::kPattern: return n.bare && g_.dfa(n.index).accepts(f.aux);  // never done: a number may go on
      default: break;
    }
    return false;
  }

  // Fewest symbols that finish frame `f` (no child of it on the stack), every symbol of the
  // count one the frame accepts there: Grammar::min_symbols() for what is still to come.
  uint64_t rest(const Frame& f) const {
    if (may_stop(f)) return 0;
    const Node& n = g_.node(f.node);
    auto mb = [&](NodeId id) { return id == kNoNode ? uint64_t{0} : g_.min_symbols(id); };
    const uint64_t need = n.min > f.aux ? n.min - f.aux : 0;  // strings, raw text: characters still required
    switch (n.kind) {
      case NodeKind::kLiteral: return g_.trie(n.index).shortest_below(f.state);
      case NodeKind::kString: {
        const uint32_t ph = kStrPhase.get(f.state);
        if (ph == kSOpen) return add_sat(2, n.min);
        if (ph == kSBody) {
          const uint32_t u = kStrUtf8.get(f.state);
          uint64_t chars = need;
          if (u == 0 && n.exclude != SymbolTrie::kNone) {
            const uint32_t at = kStrName.get(f.state);
            if (at != kNameOff && excl_names(&g_.shape(n.exclude)).terminal(at)) chars = std::max<uint64_t>(chars, 1);
          }
          return add_sat(kUtf8Left[u] + 1, chars);
        }
        // Inside an escape: its symbols left, then the character it writes counts.
        uint64_t esc = 0;
        switch (ph) {
          case kSEsc: esc = 1; break;
          case kSU1: esc = 4; break;
          case kSU2: case kSU2D: esc = 3; break;
          case kSU3: esc = 2; break;
          case kSU3H: esc = 8; break;
          case kSU4: esc = 1; break;
          case kSU4H: esc = 7; break;
          default: esc = kSDone > ph && ph >= kSLow0 ? 6 - (ph - kSLow0) : 0; break;
        }
        return add_sat(esc + 1, need > 0 ? need - 1 : 0);
      }
      case NodeKind::kPattern:
        switch (f.state) {
          case kPOpen: return g_.min_symbols(f.node);
          case kPBody: return g_.dfa_rest(n.index, f.aux) - (n.bare ? 1 : 0);
          case kPEscape: {
            uint64_t best = kNever;
            for (Symbol letter : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'})
              best = std::min(best, add_sat(1, g_.dfa_rest(n.index, escaped_state(n, f.aux, letter))));
            return best;
          }
          default: return 0;
        }
      case NodeKind::kRawText: {
        const uint32_t held = kRawHeld.get(f.state);
        if (held == 1) return need == 0 ? 2 : add_sat(need, 2);   // "/" + terminator, or "<" was text
        if (held == 2) return need == 0 ? 1 : need <= 2 ? 3 : add_sat(need, 1);
        return add_sat(kUtf8Left[kRawUtf8.get(f.state)] + 3, need);  // text, "</", terminator
      }
      case NodeKind::kUntil: return kUtf8Left[kRawUtf8.get(f.state)] + 1;
      case NodeKind::kNumber: {
        const uint32_t ph = kNumPhase.get(f.state);
        return ph == kNStart || ph == kNMinus || ph == kNDot || ph == kNE || ph == kNESign ? 1 : 0;
      }
      case NodeKind::kArray: {
        const uint64_t item = mb(n.item), per = add_sat(item, 1);
        const uint64_t missing = n.min > f.aux ? n.min - f.aux : 0;
        switch (kArrPhase.get(f.state)) {
          case kAOpen: return g_.min_symbols(f.node);
          case kAFirst: return missing == 0 ? 1 : add_sat(add_sat(item, mul_sat(per, missing - 1)), 1);
          case kAAfter: return add_sat(mul_sat(per, missing), 1);
          case kAComma: return add_sat(add_sat(item, mul_sat(per, missing > 0 ? missing - 1 : 0)), 1);
          default: return 0;
        }
      }
      case NodeKind::kObject: return rest_object(f, n);
      case NodeKind::kSeq: {
        uint64_t total = 0;
        for (size_t i = f.state; i < n.children.size(); ++i) total = add_sat(total, mb(n.children[i]));
        return total;
      }
      case NodeKind::kRepeat: {
        const uint64_t one = add_sat(mb(n.sep), mb(n.item));
        auto after = [&](uint64_t items) { return items >= n.min ? 0 : mul_sat(one, n.min - items); };
        if (f.state == kRWant) return add_sat(mb(n.item), after(uint64_t{f.aux} + 1));
        if (f.state == kRAfter) return after(f.aux);
        return add_sat(one, after(uint64_t{f.aux} + 1));
      }
      case NodeKind::kAnyOf: break;
    }
    return 0;
  }

  uint64_t rest_object(const Frame& f, const Node& n) const {
    const ObjectShape& sh = g_.shape(n.index);
    const bool json = sh.syntax == ObjectSyntax::kJson;
    const uint32_t count = static_cast<uint32_t>(sh.properties.size());
    const uint64_t close = json ? 1 : 0;
    const uint32_t next = std::min(kObjNext.get(f.state), count);
    // What the required properties from i on take, with a separator before each (after a
    // property) or between them (first), and the closing brace.
    auto tail_after = [&](uint32_t i) {
      i = std::min(i, count);
      return add_sat(sh.required_cost[i], sh.required_left[i] + close);
    };
    auto tail_first = [&](uint32_t i) {
      const uint32_t k = sh.required_left[i];
      return add_sat(sh.required_cost[i], (k > 0 ? k - 1 : 0) + close);
    };
    auto value = [&](uint32_t j) { return g_.min_symbols(j == kFreeKey ? sh.additional : sh.properties[j].value); };
    auto after_value = [&](uint32_t j) { return j == kFreeKey ? close : tail_after(j + 1); };
    switch (kObjPhase.get(f.state)) {
      case kOOpen: return add_sat(1, tail_first(0));
      case kOFirst: return tail_first(next);
      case kOAfter: return tail_after(next);
      case kOSep: {
        if (sh.required_left[next] > 0) return tail_first(next);
        uint64_t best = add_sat(sh.cheapest_from[next], close);
        if (json && sh.additional != kNoNode)  // "key":v}
          best = std::min(best, add_sat(add_sat(g_.min_symbols(sh.free_key), 2), g_.min_symbols(sh.additional)));
        return best;
      }
      case kOKey: {
        const uint32_t last = sh.next_required[next] == count ? count - 1 : sh.next_required[next];
        const uint32_t depth = sh.keys.depth(f.aux);
        uint64_t best = kNever;
        for (uint32_t j : sh.keys.values_below(f.aux)) {
          if (j < next) continue;
          if (j > last) break;
          best = std::min(best, add_sat(sh.key_symbols[j] - std::min(depth, sh.key_symbols[j]), add_sat(value(j), tail_after(j + 1))));
        }
        return best;
      }
      case kOColon: return add_sat(1, add_sat(value(f.aux), after_value(f.aux)));
      case kOValue: return add_sat(value(f.aux), after_value(f.aux));
      default: return 0;
    }
  }

  // The top frame's child finished: the frame moves past it, then frames that are done pop.
  void child_done(Stack& st) {
    if (st.empty()) return;
    child_done_frame(st.back());
    settle(st);
  }

  void settle(Stack& st) {
    while (!st.empty() && done(st.back())) {
      st.pop_back();
      if (!st.empty()) child_done_frame(st.back());
    }
  }

  void child_done_frame(Frame& f) const {
    const Node& n = g_.node(f.node);
    switch (n.kind) {
      case NodeKind::kArray:
        f.state = kArrPhase.set(0, kAAfter);
        f.aux = bump(f.aux, n);
        break;
      case NodeKind::kObject: {
        const ObjectShape& sh = g_.shape(n.index);
        if (kObjPhase.get(f.state) == kOValue) {
          const uint32_t next = f.aux == kFreeKey ? static_cast<uint32_t>(sh.properties.size()) : f.aux + 1;
          f.state = kObjNext.set(kObjPhase.set(0, kOAfter), next);
          f.aux = 0;
        } else {  // the free key's string
          f.state = kObjNext.set(kObjPhase.set(0, kOColon), kObjNext.get(f.state));
          f.aux = kFreeKey;
        }
        break;
      }
      case NodeKind::kSeq: ++f.state; break;
      case NodeKind::kRepeat:
        if (f.state == kRWant) {
          f.state = kRAfter;
          ++f.aux;
        } else {
          f.state = kRWant;
        }
        break;
      default: break;  // leaves have no children
    }
  }

  void emit(Stack st) {
    settle(st);
    out_.push_back(std::move(st));
  }

  // Object helpers. Keys that may be written next: indices in [next, first required at or
  // after next], whose value still fits the frame budget.
  bool key_possible(const ObjectShape& sh, uint32_t trie_node, uint32_t next, size_t depth) const {
    const uint32_t n = static_cast<uint32_t>(sh.properties.size());
    if (next >= n) return false;
    const uint32_t last = sh.next_required[next] == n ? n - 1 : sh.next_required[next];
    for (uint32_t j : sh.keys.values_below(trie_node)) {
      if (j < next) continue;
      if (j > last) break;
      if (depth + g_.min_frames(sh.properties[j].value) <= kMaxFrames) return true;
    }
    return false;
  }
  bool may_close(const ObjectShape& sh, uint32_t next) const {
    return sh.next_required[std::min<size_t>(next, sh.properties.size())] == sh.properties.size();
  }
  bool free_key_possible(const ObjectShape& sh, uint32_t next, size_t depth) const {
    return sh.additional != kNoNode && may_close(sh, next) && depth + 1 <= kMaxFrames &&
           depth + g_.min_frames(sh.additional) <= kMaxFrames;
  }

  void consume(Stack st, Symbol s) {
    Frame& f = st.back();
    const Node& n = g_.node(f.node);
    switch (n.kind) {
      case NodeKind::kLiteral: {
        const uint32_t next = g_.trie(n.index).child(f.state, s);
        if (next == SymbolTrie::kNone) return;
        f.state = next;
        return emit(std::move(st));
      }
      case NodeKind::kString: return consume_string(std::move(st), s, n);
      case NodeKind::kPattern: return consume_pattern(std::move(st), s, n);
      case NodeKind::kRawText: return consume_raw(std::move(st), s, n);
      case NodeKind::kUntil: {
        if (s == n.terminator) {
          f.state = kRawDone.set(f.state, 1);
          return emit(std::move(st));
        }
        if (s >= 256) return;
        const int u = utf8_next(kRawUtf8.get(f.state), static_cast<uint8_t>(s));
        if (u < 0) return;
        uint32_t pat = kRawPat.get(f.state);
        if (n.pattern) {
          pat = g_.pattern(n.pattern).next(pat, static_cast<uint8_t>(s));
          if (pat == g_.pattern(n.pattern).size()) return;
        }
        f.state = kRawPat.set(kRawUtf8.set(f.state, static_cast<uint32_t>(u)), pat);
        return emit(std::move(st));
      }
      case NodeKind::kNumber: return consume_number(std::move(st), s, n);
      case NodeKind::kArray: return consume_array(std::move(st), s, n);
      case NodeKind::kObject: return consume_object(std::move(st), s, n);
      case NodeKind::kSeq: {
        if (f.state >= n.children.size()) return;
        const NodeId c = n.children[f.state];
        return enter(st, c, s);
      }
      case NodeKind::kRepeat: {
        if (f.state == kRWant) {
          if (f.aux >= n.max) return;
          return enter(st, n.item, s);
        }
        if (f.state == kRAfter) {
          if (f.aux >= n.max) return;
          if (st.size() + g_.min_frames(n.item) > kMaxFrames) return;
          if (n.sep == kNoNode) {
            f.state = kRWant;
            return enter(st, n.item, s);
          }
          f.state = kRSep;
          return enter(st, n.sep, s);
        }
        return;
      }
      case NodeKind::kAnyOf: return;
    }
  }

  // The automaton's state after the escape \<letter> (kDead: no such escape, or the byte it
  // writes does not fit).
  uint32_t escaped_state(const Node& n, uint32_t state, Symbol letter) const {
    const int byte = short_escape(letter);
    return byte < 0 ? ByteDfa::kDead : g_.dfa(n.index).step(state, static_cast<uint8_t>(byte));
  }

  // A string read through its automaton: raw bytes other than '"', '\\' and control bytes
  // step it, a short escape steps it with the byte it writes, the closing quote needs an
  // accepting state. The automaton is trimmed, so each live state still finishes.
  void consume_pattern(Stack st, Symbol s, const Node& n) {
    Frame& f = st.back();
    const ByteDfa& d = g_.dfa(n.index);
    if (s >= 256) return;
    if (n.bare) {
      const uint32_t next = d.step(f.aux, static_cast<uint8_t>(s));
      if (next == ByteDfa::kDead) return;
      f.aux = next;
      return emit(std::move(st));
    }
    switch (f.state) {
      case kPOpen:
        if (s != '"') return;
        f.state = kPBody;
        f.aux = d.start;
        return emit(std::move(st));
      case kPBody: {
        if (s == '"') {
          if (!d.accepts(f.aux)) return;
          f.state = kPDone;
          return emit(std::move(st));
        }
        if (s == '\\') {
          bool any = false;
          for (Symbol letter : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'})
            any = any || escaped_state(n, f.aux, letter) != ByteDfa::kDead;
          if (!any) return;
          f.state = kPEscape;
          return emit(std::move(st));
        }
        if (s < 0x20) return;
        const uint32_t next = d.step(f.aux, static_cast<uint8_t>(s));
        if (next == ByteDfa::kDead) return;
        f.aux = next;
        return emit(std::move(st));
      }
      case kPEscape: {
        const uint32_t next = escaped_state(n, f.aux, s);
        if (next == ByteDfa::kDead) return;
        f.state = kPBody;
        f.aux = next;
        return emit(std::move(st));
      }
      default: return;
    }
  }

  void consume_string(Stack st, Symbol s, const Node& n) {
    Frame& f = st.back();
    if (s >= 256) return;
    const uint8_t b = static_cast<uint8_t>(s);
    uint32_t state = f.state;
    const uint32_t ph = kStrPhase.get(state);
    const ObjectShape* excl = n.exclude != SymbolTrie::kNone ? &g_.shape(n.exclude) : nullptr;
    auto set_phase = [&](uint32_t p) { state = kStrPhase.set(state, p); };
    auto finish_char = [&] {
      f.aux = bump(f.aux, n);
      set_phase(kSBody);
    };
    switch (ph) {
      case kSOpen:
        if (b != '"') return;
        set_phase(kSBody);
        state = kStrName.set(state, excl ? 0 : kNameOff);
        break;
      case kSBody: {
        const uint32_t u = kStrUtf8.get(state);
        if (u == 0 && b == '"') {
          if (f.aux < n.min) return;
          if (excl) {
            const uint32_t at = kStrName.get(state);
            if (at != kNameOff && excl_names(excl).terminal(at)) return;  // a declared name
          }
          set_phase(kSDone);
          break;
        }
        if (u == 0 && b == '\\') {
          if (n.no_escapes || !room(f.aux, n)) return;
          set_phase(kSEsc);
          state = kStrPat.set(state, 0);
          break;
        }
        if (u == 0 && b < 0x20) return;
        const int next = utf8_next(u, b);
        if (next < 0) return;
        if (u == 0) {
          if (!room(f.aux, n)) return;
          f.aux = bump(f.aux, n);
        }
        state = kStrUtf8.set(state, static_cast<uint32_t>(next));
        if (n.pattern) {
          const BytePattern& p = g_.pattern(n.pattern);
          const uint32_t q = p.next(kStrPat.get(state), b);
          if (q == p.size()) return;
          state = kStrPat.set(state, q);
        }
        if (excl) {
          const uint32_t at = kStrName.get(state);
          uint32_t to = at == kNameOff ? SymbolTrie::kNone : excl_names(excl).child(at, b);
          state = kStrName.set(state, to == SymbolTrie::kNone ? kNameOff : to);
        }
        break;
      }
      case kSEsc:
        if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
          finish_char();
        } else if (b == 'u') {
          set_phase(kSU1);
        } else {
          return;
        }
        break;
      case kSU1:
        if (!is_hex(b)) return;
        set_phase(b == 'd' || b == 'D' ? kSU2D : kSU2);
        break;
      case kSU2:
        if (!is_hex(b)) return;
        set_phase(kSU3);
        break;
      case kSU2D:  // \uD?: 8-B starts a high surrogate, C-F would be a lone low one
        if (!is_hex(b)) return;
        if ((b >= '8' && b <= '9') || b == 'a' || b == 'b' || b == 'A' || b == 'B') set_phase(kSU3H);
        else if (b >= '0' && b <= '7') set_phase(kSU3);
        else return;
        break;
      case kSU3:
        if (!is_hex(b)) return;
        set_phase(kSU4);
        break;
      case kSU3H:
        if (!is_hex(b)) return;
        set_phase(kSU4H);
        break;
      case kSU4:
        if (!is_hex(b)) return;
        finish_char();
        break;
      case kSU4H:
        if (!is_hex(b)) return;
        set_phase(kSLow0);
        break;
      case kSLow0:
        if (b != '\\') return;
        set_phase(kSLow1);
        break;
      case kSLow1:
        if (b != 'u') return;
        set_phase(kSLow2);
        break;
      case kSLow2:
        if (b != 'd' && b != 'D') return;
        set_phase(kSLow3);
        break;
      case kSLow3:
        if (!((b >= 'c' && b <= 'f') || (b >= 'C' && b <= 'F'))) return;
        set_phase(kSLow4);
        break;
      case kSLow4:
        if (!is_hex(b)) return;
        set_phase(kSLow5);
        break;
      case kSLow5:
        if (!is_hex(b)) return;
        finish_char();
        break;
      default: return;
    }
    f.state = state;
    emit(std::move(st));
  }

  static const SymbolTrie& excl_names(const ObjectShape* sh) { return sh->raw_names; }

  // Raw text ends with "</" + the terminator symbol; "<" and "</" are held back until the next
  // symbol shows whether they are text.
  void consume_raw(Stack st, Symbol s, const Node& n) {
    Frame& f = st.back();
    uint32_t state = f.state;
    const uint32_t held = kRawHeld.get(state);
    if (s == n.terminator) {
      if (held != 2 || f.aux < n.min) return;
      f.state = kRawDone.set(state, 1);
      return emit(std::move(st));
    }
    if (s >= 256) return;
    const uint8_t b = static_cast<uint8_t>(s);
    uint32_t next_held = 0;
    if (held == 1 && b == '/') {
      next_held = 2;
    } else {
      // The held bytes were text after all (each one a character).
      for (uint32_t k = 0; k < held; ++k) {
        if (!room(f.aux, n)) return;
        f.aux = bump(f.aux, n);
      }
      if (b == '<' && kRawUtf8.get(state) == 0) next_held = 1;
    }
    const uint32_t u = kRawUtf8.get(state);
    const int next = utf8_next(u, b);
    if (next < 0) return;
    uint32_t pat = kRawPat.get(state);
    if (n.pattern) {
      const BytePattern& p = g_.pattern(n.pattern);
      pat = p.next(pat, b);
      if (pat == p.size()) return;
    }
    if (u == 0 && next_held == 0) {
      if (!room(f.aux, n)) return;
      f.aux = bump(f.aux, n);
    }
    f.state = kRawHeld.set(kRawPat.set(kRawUtf8.set(state, static_cast<uint32_t>(next)), pat), next_held);
    emit(std::move(st));
  }

  void consume_number(Stack st, Symbol s, const Node& n) {
    Frame& f = st.back();
    const uint32_t ph = kNumPhase.get(f.state), d = kNumDigits.get(f.state);
    auto go = [&](uint32_t phase, uint32_t digits) {
      f.state = kNumDigits.set(kNumPhase.set(0, phase), digits);
      emit(std::move(st));
    };
    const bool digit = is_digit(s);
    const bool frac_ok = !n.integer && s == '.';
    const bool exp_ok = !n.integer && (s == 'e' || s == 'E');
    switch (ph) {
      case kNStart:
        if (s == '-') return go(kNMinus, 0);
        [[fallthrough]];
      case kNMinus:
        if (s == '0') return go(kNZero, 1);
        if (digit) return go(kNInt, 1);
        return;
      case kNZero:
      case kNInt:
        if (ph == kNInt && digit && d < kMaxIntDigits) return go(kNInt, d + 1);
        if (frac_ok) return go(kNDot, 0);
        if (exp_ok) return go(kNE, 0);
        return;
      case kNDot:
        if (digit) return go(kNFrac, 1);
        return;
      case kNFrac:
        if (digit && d < kMaxFracDigits) return go(kNFrac, d + 1);
        if (exp_ok) return go(kNE, 0);
        return;
      case kNE:
        if (s == '+' || s == '-') return go(kNESign, 0);
        if (digit) return go(kNExp, 1);
        return;
      case kNESign:
        if (digit) return go(kNExp, 1);
        return;
      case kNExp:
        if (digit && d < kMaxExpDigits) return go(kNExp, d + 1);
        return;
    }
  }

  void consume_array(Stack st, Symbol s, const Node& n) {
    Frame& f = st.back();
    const uint32_t ph = kArrPhase.get(f.state), ws = kArrWs.get(f.state);
    auto go = [&](uint32_t phase, uint32_t w) {
      f.state = kArrWs.set(kArrPhase.set(0, phase), w);
      emit(std::move(st));
    };
    const bool item_fits = room(f.aux, n) && st.size() + g_.min_frames(n.item) <= kMaxFrames;
    if (ph == kAOpen) {
      if (s == '[') go(kAFirst, 0);
      return;
    }
    if (ph != kADone && is_ws(s)) {
      if (ws < kMaxWhitespace) go(ph, ws + 1);
      return;
    }
    switch (ph) {
      case kAFirst:
        if (s == ']') {
          if (n.min == 0) go(kADone, 0);
          return;
        }
        if (s < 256 && item_fits) {
          f.state = kArrPhase.set(0, kAFirst);
          enter(st, n.item, s);
        }
        return;
      case kAAfter:
        if (s == ',' && item_fits) return go(kAComma, 0);
        if (s == ']' && f.aux >= n.min) return go(kADone, 0);
        return;
      case kAComma:
        if (s < 256 && s != ']' && item_fits) {
          f.state = kArrPhase.set(0, kAComma);
          enter(st, n.item, s);
        }
        return;
    }
  }

  void consume_object(Stack st, Symbol s, const Node& n) {
    Frame& f = st.back();
    const ObjectShape& sh = g_.shape(n.index);
    const bool json = sh.syntax == ObjectSyntax::kJson;
    const uint32_t ph = kObjPhase.get(f.state), ws = kObjWs.get(f.state), next = kObjNext.get(f.state);
    const size_t depth = st.size();
    auto go = [&](uint32_t phase, uint32_t w, uint32_t aux) {
      f.state = kObjNext.set(kObjWs.set(kObjPhase.set(0, phase), w), next);
      f.aux = aux;
      emit(std::move(st));
    };
    if (ph == kOOpen) {
      if (s == '{') go(kOFirst, 0, 0);
      return;
    }
    if (json && ph != kOKey && ph != kODone && is_ws(s)) {
      if (ws < kMaxWhitespace) go(ph, ws + 1, f.aux);
      return;
    }
    const Symbol sep = json ? Symbol{','} : Symbol{'\n'};
    switch (ph) {
      case kOFirst:
      case kOSep: {
        if (json && ph == kOFirst && s == '}') {
          if (may_close(sh, next)) go(kODone, 0, 0);
          return;
        }
        const uint32_t at = sh.keys.child(0, s);
        if (at != SymbolTrie::kNone && key_possible(sh, at, next, depth)) {
          Stack declared = st;
          Frame& d = declared.back();
          d.state = kObjNext.set(kObjPhase.set(0, kOKey), next);
          d.aux = at;
          settle_key(declared, sh, json);
        }
        if (json && s == '"' && free_key_possible(sh, next, depth)) {
          f.state = kObjNext.set(kObjPhase.set(0, ph), next);
          f.aux = 0;
          enter(st, sh.free_key, s);
        }
        return;
      }
      case kOKey: {
        const uint32_t at = sh.keys.child(f.aux, s);
        if (at == SymbolTrie::kNone || !key_possible(sh, at, next, depth)) return;
        f.aux = at;
        return settle_key(st, sh, json);
      }
      case kOColon:
        if (s == ':') go(kOValue, 0, f.aux);
        return;
      case kOValue: {
        if (s >= 256) return;
        const NodeId value = f.aux == kFreeKey ? sh.additional : sh.properties[f.aux].value;
        f.state = kObjNext.set(kObjPhase.set(0, kOValue), next);
        return enter(st, value, s);
      }
      case kOAfter:
        if (s == sep) {
          const bool declared = key_possible(sh, 0, next, depth);
          if (declared || (json && free_key_possible(sh, next, depth))) go(kOSep, 0, 0);
          return;
        }
        if (json && s == '}' && may_close(sh, next)) go(kODone, 0, 0);
        return;
    }
  }

  // After a key symbol: a complete key selects its property.
  void settle_key(Stack st, const ObjectShape& sh, bool json) {
    Frame& f = st.back();
    if (sh.keys.terminal(f.aux)) {
      const uint32_t j = sh.keys.value(f.aux);
      f.state = kObjNext.set(kObjPhase.set(0, json ? kOColon : kOValue), kObjNext.get(f.state));
      f.aux = j;
    }
    emit(std::move(st));
  }

  const Grammar& g_;
  StackSet& out_;
};

void canonicalize(StackSet& set) {
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
  if (set.size() > kMaxStacks) set.resize(kMaxStacks);
}

}  // namespace

StackSet initial_stacks(const Grammar& g) {
  StackSet out;
  Walker w(g, out);
  w.expand({}, g.root());
  canonicalize(out);
  return out;
}

StackSet advance(const Grammar& g, const StackSet& set, Symbol s) {
  StackSet out;
  Walker w(g, out);
  for (const Stack& st : set) w.feed(st, s);
  canonicalize(out);
  return out;
}

bool can_end(const Grammar& g, const StackSet& set) { return !advance(g, set, kEnd).empty(); }

bool is_complete(const StackSet& set) { return set.size() == 1 && set[0].empty(); }

namespace {

// Whether the shortest finish of a (non-empty) stack still needs the end token: its bottom
// frame may stop without closing (a number, a repeat below its maximum...). A sequence whose
// last part is on the stack leaves it to that part's frame; one whose last part is still to
// come, to the shortest ending of that part.
uint64_t end_token_after(const Grammar& g, const Stack& st) {
  for (size_t i = 0; i < st.size(); ++i) {
    const Frame& f = st[i];
    const Node& n = g.node(f.node);
    if (n.kind != NodeKind::kSeq || n.children.empty()) return g.closes(f.node) ? 0 : 1;
    const size_t last = n.children.size() - 1;
    if (f.state == last && i + 1 < st.size()) continue;  // the frame above is the last part
    if (f.state > last) return 0;
    return g.min_ending(n.children[last]) - g.min_symbols(n.children[last]);
  }
  return 1;
}

}  // namespace

uint64_t tokens_to_finish(const Grammar& g, const StackSet& set) {
  if (is_complete(set)) return 0;
  StackSet none;
  const Walker w(g, none);
  uint64_t best = kNever;
  for (const Stack& st : set) {
    // An empty stack beside others: the text may end, with the end token.
    best = std::min(best, st.empty() ? 1 : add_sat(w.symbols_to_finish(st), end_token_after(g, st)));
  }
  return best;
}

void encode_stacks(const StackSet& set, std::vector<uint32_t>& out) {
  out.clear();
  out.push_back(static_cast<uint32_t>(set.size()));
  for (const Stack& st : set) {
    out.push_back(static_cast<uint32_t>(st.size()));
    for (const Frame& f : st) {
      out.push_back(f.node);
      out.push_back(f.state);
      out.push_back(f.aux);
    }
  }
}

StackSet decode_stacks(std::span<const uint32_t> key) {
  StackSet set;
  size_t i = 0;
  const uint32_t count = key[i++];
  set.resize(count);
  for (uint32_t k = 0; k < count; ++k) {
    const uint32_t len = key[i++];
    set[k].resize(len);
    for (uint32_t j = 0; j < len; ++j) {
      set[k][j] = Frame{key[i], key[i + 1], key[i + 2]};
      i += 3;
    }
  }
  return set;
}

}  // namespace dsv4::constrain
