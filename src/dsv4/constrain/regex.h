// Regular expressions for JSON Schema's `pattern` and `format`, compiled to deterministic
// automata over the UTF-8 bytes of a string's decoded text.
//
// The dialect is ECMA-262 as the mainstream schema engines accept it: literals and escapes
// (\t \n \r \f \v \0 \xHH \uHHHH \u{…}, escaped syntax characters), `.`, classes with ranges
// and negation, \d \D \w \W \s \S (inside classes too), groups (capturing, (?:…), (?<name>…)),
// alternation, the quantifiers * + ? {n} {n,} {n,m} (lazy forms match the same strings), and
// the anchors ^ and $ at the start and end of the pattern or of its top-level alternatives.
// Backreferences, look-around, \b / \B and anchors elsewhere are refused by name. A pattern
// matches a string when it matches some part of it (JSON Schema's search semantics), so an
// unanchored side accepts anything before or after.
//
// Every automaton here is trimmed: each live state can still reach an accepting one, so a
// recognizer that only takes live transitions never strands itself.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/util/error.h"

namespace dsv4::constrain {

// Bytes are grouped into classes that every state treats alike; the table is states × classes.
struct ByteDfa {
  static constexpr uint32_t kDead = std::numeric_limits<uint32_t>::max();
  uint32_t start = kDead;
  uint32_t classes = 1;
  std::array<uint8_t, 256> byte_class{};
  std::vector<uint32_t> table;  // [state * classes + class] -> state or kDead
  std::vector<uint8_t> accept;  // [state]

  uint32_t size() const { return static_cast<uint32_t>(accept.size()); }
  uint32_t step(uint32_t state, uint8_t byte) const { return table[size_t(state) * classes + byte_class[byte]]; }
  bool accepts(uint32_t state) const { return state != kDead && accept[state] != 0; }
  size_t memory_bytes() const { return table.size() * sizeof(uint32_t) + accept.size() + sizeof(ByteDfa); }
};

// Automata beyond these are refused (a pattern whose automaton explodes): states, and table
// entries (states × byte classes, 4 bytes each: at most 4 MiB).
inline constexpr uint32_t kMaxDfaStates = 65536;
inline constexpr size_t kMaxDfaEntries = size_t{1} << 20;

// `pattern` with JSON Schema's semantics (matches if it matches a part of the text). Throws
// Error naming what is unsupported or malformed, or when nothing matches.
// `max_states` bounds the automata it builds on the way (a caller's budget over many patterns).
ByteDfa regex_dfa(std::string_view pattern, uint32_t max_states = kMaxDfaStates);
// The formats with a definition here (date-time, date, time, duration, email, hostname, ipv4,
// ipv6, uri, uri-reference, uuid); others are annotations.
bool known_format(std::string_view format);
const ByteDfa& format_dfa(std::string_view format);
// Texts both accept.
ByteDfa intersect(const ByteDfa& a, const ByteDfa& b, uint32_t max_states = kMaxDfaStates);
// Texts `a` accepts and `b` does not.
ByteDfa subtract(const ByteDfa& a, const ByteDfa& b, uint32_t max_states = kMaxDfaStates);
// Exactly the given texts.
ByteDfa literal_set_dfa(const std::vector<std::string>& texts);
// Texts `a` accepts with between min and max code points (max UINT32_MAX: no upper bound).
ByteDfa bound_length(const ByteDfa& a, uint32_t min_chars, uint32_t max_chars, uint32_t max_states = kMaxDfaStates);
// Texts `a` accepts that never contain `forbidden`'s bytes.
ByteDfa excluding(const ByteDfa& a, std::string_view forbidden);
// Only what a generated JSON string can hold without \u escapes: valid UTF-8, no control bytes
// other than those with a short escape (\b \f \n \r \t).
ByteDfa writable_in_json(const ByteDfa& a);
// A pattern (no anchors) for the decimal integers lo..hi, written without leading zeros
// (0 <= lo <= hi): alternatives of digit classes, as in "1[0-9]|[2-9][0-9]|1[0-4][0-9]|150".
std::string integer_range_pattern(uint64_t lo, uint64_t hi);
// The decimal integers (optional "-", no leading zeros, at most `max_digits` digits) that are
// multiples of `k` (k >= 1): one state per (digits so far, remainder).
ByteDfa multiples_dfa(uint64_t k, uint32_t max_digits, uint32_t max_states = kMaxDfaStates);
// Whether `a` accepts exactly `text` (tests).
bool full_match(const ByteDfa& a, std::string_view text);

}  // namespace dsv4::constrain
