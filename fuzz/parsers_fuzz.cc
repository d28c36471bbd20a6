// libFuzzer target for everything that parses checkpoint metadata from untrusted bytes:
// the safetensors header, the shard index and config.json, and the bounded line reader of
// `run --batch` (blank lines, lines over the bound, a last line without '\n'). The first input
// byte picks the parser. Any Error is an expected rejection; crashes and sanitizer reports are bugs.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "dsv4/io/checkpoint.h"
#include "dsv4/io/config.h"
#include "dsv4/io/safetensors.h"
#include "dsv4/util/error.h"
#include "dsv4/util/line_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] % 4;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (which) {
      case 0: {
        // Header followed by a fake data section of a size taken from the text length.
        dsv4::SafetensorsFile::parse_header(text, 8 + text.size(), 8 + text.size() + 4096, "fuzz.safetensors");
        break;
      }
      case 1:
        dsv4::parse_weight_map(text, "fuzz.index.json");
        break;
      case 2:
        dsv4::ModelConfig::from_json(text, "fuzz/config.json");
        break;
      case 3: {
        // Every physical line as std::getline splits them, the long ones reported by length alone.
        const size_t bound = data[0] / 4 % 16;
        std::istringstream in(text), expected(text);
        dsv4::BoundedLineReader reader(in, bound);
        dsv4::BoundedLineReader::Line line;
        for (std::string want; std::getline(expected, want);) {
          if (!reader.next(line) || line.bytes != want.size() || line.too_long != (want.size() > bound) ||
              (!line.too_long && line.text != want))
            __builtin_trap();
        }
        if (reader.next(line)) __builtin_trap();
        break;
      }
    }
  } catch (const dsv4::Error&) {
  }
  return 0;
}
