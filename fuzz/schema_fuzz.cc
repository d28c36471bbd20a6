// libFuzzer target for the JSON Schema compiler and the recognizer it feeds. The input is a
// schema (JSON text), then a 0x00 byte, then text to recognize. Any Error is an expected
// rejection; crashes, sanitizer reports and broken invariants are bugs:
//   - a compiled schema always has a non-empty start;
//   - recognition never reaches a dead end: every state reached can still read some symbol or
//     end (this is what guarantees that a mask never forbids every token).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dsv4/constrain/answer_grammar.h"
#include "dsv4/constrain/grammar.h"
#include "dsv4/util/error.h"

namespace {

using namespace dsv4::constrain;

bool has_way_on(const Grammar& g, const StackSet& set) {
  if (can_end(g, set)) return true;
  for (size_t s = 0; s < kFirstSpecial + g.specials().size(); ++s)
    if (!advance(g, set, static_cast<Symbol>(s)).empty()) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string schema_text = input.substr(0, split);
  const std::string text = split == std::string::npos ? "" : input.substr(split + 1, 256);
  const Json schema = Json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return 0;
  try {
    AnswerFormat f;
    f.content_schema = &schema;
    f.thinking = !text.empty() && (text[0] & 1);
    const Grammar g = build_answer_grammar(f);
    StackSet set = initial_stacks(g);
    if (set.empty()) std::abort();
    for (char c : text) {
      StackSet next = advance(g, set, static_cast<uint8_t>(c));
      if (next.empty()) break;
      set = std::move(next);
    }
    if (!has_way_on(g, set)) std::abort();
  } catch (const dsv4::Error&) {
  }
  return 0;
}
