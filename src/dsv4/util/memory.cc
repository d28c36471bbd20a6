#include "dsv4/util/memory.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "dsv4/platform/platform.h"

namespace dsv4 {
uint64_t peak_rss_bytes() { return platform::peak_rss_bytes(); }
uint64_t current_rss_bytes() { return platform::current_rss_bytes(); }
uint64_t available_memory_bytes() { return platform::available_memory_bytes(); }

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  // Digits with at most one decimal point, then an optional unit.
  size_t i = 0;
  bool digits = false, point = false;
  for (; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch >= '0' && ch <= '9') {
      digits = true;
    } else if (ch == '.' && !point) {
      point = true;
    } else {
      break;
    }
  }
  if (!digits) return std::nullopt;
  std::string_view unit = text.substr(i);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.remove_suffix(1);
  if (!unit.empty() && unit.back() == 'i') unit.remove_suffix(1);
  double scale;
  if (unit.empty()) {
    scale = 1;
  } else if (unit.size() == 1) {
    switch (unit[0]) {
      case 'K': case 'k': scale = 0x1p10; break;
      case 'M': case 'm': scale = 0x1p20; break;
      case 'G': case 'g': scale = 0x1p30; break;
      case 'T': case 't': scale = 0x1p40; break;
      default: return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  const double value = std::strtod(std::string(text.substr(0, i)).c_str(), nullptr) * scale;
  if (!std::isfinite(value) || value > 0x1p60) return std::nullopt;
  if (scale == 1 && point) return std::nullopt;  // a fraction of a byte
  return static_cast<uint64_t>(value);
}

std::string format_bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

}  // namespace dsv4
