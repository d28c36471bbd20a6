// UTF-8 helpers shared by the tokenizer and the chat encoding.
//
// Invalid UTF-8 policy (the tokenizer's input and its decoded output): every maximal ill-formed
// subpart is replaced by U+FFFD, exactly as the WHATWG TextDecoder, Rust's from_utf8_lossy and
// Python's errors="replace" do. The tokenizer oracle (tests/node) checks this against JavaScript's
// TextDecoder followed by the Hugging Face tokenizer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dsv4::text {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the longest prefix of `s` that is a sequence of complete, valid UTF-8 characters.
size_t valid_utf8_prefix(std::string_view s);

inline bool is_valid_utf8(std::string_view s) { return valid_utf8_prefix(s) == s.size(); }

// `s` with every maximal ill-formed subpart replaced by U+FFFD (returns `s` unchanged if valid).
std::string to_valid_utf8(std::string_view s);

// Appends the valid-or-replaced form of bytes[0..n) to `out` and returns how many bytes were
// consumed. With `final == false` a trailing incomplete-but-still-possible character is left
// unconsumed so that a later call, with more bytes, can complete it (streaming decode).
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out);

// Appends the UTF-8 encoding of code point `cp` (must be a Unicode scalar value).
void append_utf8(char32_t cp, std::string& out);

// Decodes the character at s[i] (s must be valid UTF-8 there); advances i.
char32_t next_code_point(std::string_view s, size_t& i);

}  // namespace dsv4::text
