#include "dsv4/text/byte_level.h"

#include "dsv4/text/utf8.h"

namespace dsv4::text {

ByteLevelAlphabet::ByteLevelAlphabet() {
  char_to_byte_.fill(-1);
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
    byte_to_char_[b] = cp;
    char_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

std::optional<std::string> ByteLevelAlphabet::to_bytes(std::string_view shown) const {
  if (!is_valid_utf8(shown)) return std::nullopt;
  std::string out;
  out.reserve(shown.size());
  size_t i = 0;
  while (i < shown.size()) {
    const auto b = byte_of(next_code_point(shown, i));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

std::string ByteLevelAlphabet::to_shown(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(char_of(static_cast<uint8_t>(c)), out);
  return out;
}

}  // namespace dsv4::text
