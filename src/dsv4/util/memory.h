// Process memory facts: peak and current resident set, and what the machine can give.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsv4 {

// Peak and current resident set of this process (bytes; 0 if unavailable).
uint64_t peak_rss_bytes();
uint64_t current_rss_bytes();

// What the machine can still give this process (platform/platform.h; bytes, 0 if unavailable).
uint64_t available_memory_bytes();

// "123456" (bytes), "800K", "512M", "1.5G", "2T" (powers of 1024; an optional "i" and/or "B"
// after the unit, either case). Nothing else: no sign, no spaces, no exponent; nullopt when the
// text is not exactly such a size or it exceeds 2^60 bytes.
std::optional<uint64_t> parse_byte_size(std::string_view text);

// "1.50 GiB", "12.8 MiB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace dsv4
