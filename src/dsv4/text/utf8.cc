#include "dsv4/text/utf8.h"

#include <cstdint>

namespace dsv4::text {
namespace {

// Classifies the sequence starting at s[i]. Returns the length of a complete valid character,
// or 0 with `subpart` set to the length of the maximal ill-formed subpart (>= 1), or 0 with
// `incomplete` set when the bytes run out in the middle of a still-valid prefix.
size_t classify(std::string_view s, size_t i, size_t& subpart, bool& incomplete) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  incomplete = false;
  subpart = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;  // C0, C1, F5..FF, or a stray continuation byte
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      incomplete = true;
      subpart = k;
      return 0;
    }
    const uint8_t b = byte(i + k);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      subpart = k;
      return 0;
    }
  }
  return need;
}

}  // namespace

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Fast path over ASCII.
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t subpart;
    bool incomplete;
    const size_t n = classify(s, i, subpart, incomplete);
    if (n == 0) return i;
    i += n;
  }
  return i;
}

size_t append_utf8_lossy(std::string_view s, bool final, std::string& out) {
  size_t i = 0;
  while (i < s.size()) {
    size_t run = i;
    while (run < s.size() && static_cast<uint8_t>(s[run]) < 0x80) ++run;
    out.append(s.data() + i, run - i);
    i = run;
    if (i >= s.size()) break;
    size_t subpart;
    bool incomplete;
    const size_t n = classify(s, i, subpart, incomplete);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else if (incomplete && !final) {
      return i;  // wait for more bytes
    } else {
      out.append(kReplacementChar);
      i += subpart;
    }
  }
  return i;
}

std::string to_valid_utf8(std::string_view s) {
  const size_t prefix = valid_utf8_prefix(s);
  if (prefix == s.size()) return std::string(s);
  std::string out(s.substr(0, prefix));
  append_utf8_lossy(s.substr(prefix), /*final=*/true, out);
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(s[k])); };
  const char32_t b0 = b(i);
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t cp = ((b0 & 0x1F) << 6) | (b(i + 1) & 0x3F);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const char32_t cp = ((b0 & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    i += 3;
    return cp;
  }
  const char32_t cp = ((b0 & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
  i += 4;
  return cp;
}

}  // namespace dsv4::text
