#include "dsv4/io/value_check.h"

#include <fmt/format.h>

namespace dsv4 {

std::string describe_e8m0(uint8_t code) {
  if (code == 0xFF) return "0xFF (NaN)";
  return fmt::format("0x{:02X} (2^{})", code, int(code) - 127);
}

}  // namespace dsv4
