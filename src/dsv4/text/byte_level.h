// The GPT-2 "byte-level" alphabet used by Hugging Face ByteLevel pre-tokenizers and decoders:
// each of the 256 byte values is shown as one printable Unicode character, so that a vocabulary
// of byte strings can be stored as JSON text. Printable Latin-1 bytes map to themselves; the
// other 68 bytes (controls, space, DEL, NBSP, soft hyphen) map to U+0100.. in byte order.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsv4::text {

class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();

  char32_t char_of(uint8_t byte) const { return byte_to_char_[byte]; }

  // The byte shown by code point `cp`, or nothing if `cp` is not one of the 256 characters.
  std::optional<uint8_t> byte_of(char32_t cp) const {
    if (cp >= char_to_byte_.size() || char_to_byte_[cp] < 0) return std::nullopt;
    return static_cast<uint8_t>(char_to_byte_[cp]);
  }

  // Maps a byte-level string (as stored in tokenizer.json) back to the raw bytes it shows.
  // Returns nothing if it contains a character outside the alphabet or is not valid UTF-8.
  std::optional<std::string> to_bytes(std::string_view shown) const;

  // The byte-level form of raw bytes (the inverse of to_bytes).
  std::string to_shown(std::string_view bytes) const;

 private:
  std::array<char32_t, 256> byte_to_char_{};
  std::array<int16_t, 324> char_to_byte_{};  // every mapped code point is below 256 + 68
};

}  // namespace dsv4::text
