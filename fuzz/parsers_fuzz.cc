// libFuzzer target for everything that parses checkpoint metadata from untrusted bytes:
// the safetensors header, the shard index and config.json. The first input byte picks
// the parser. Any Error is an expected rejection; crashes and sanitizer reports are bugs.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dsv4/io/checkpoint.h"
#include "dsv4/io/config.h"
#include "dsv4/io/safetensors.h"
#include "dsv4/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] % 3;
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
    }
  } catch (const dsv4::Error&) {
  }
  return 0;
}
