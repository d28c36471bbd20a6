// libFuzzer target for the text side: tokenizer.json loading, encode/decode (with the
// round-trip invariant), the streaming decoder, the chat encoder and the completion parser, and
// the special-token cases: plain ranges (no added token inside one), the bounded encode (a
// prefix of the full one's length) and the decoder that leaves special tokens out.
// The first input byte picks the target. Error is an expected rejection; crashes, sanitizer
// reports and broken invariants (__builtin_trap) are bugs. Run from the repository root so the
// fixture tokenizer (../shared/fixtures/tiny-a/tokenizer.json) is found.
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsv4/text/chat_format.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/text/utf8.h"
#include "dsv4/util/error.h"

namespace {

const dsv4::text::Tokenizer* fixture() {
  static const std::unique_ptr<dsv4::text::Tokenizer> tok = [] {
    try {
      return std::make_unique<dsv4::text::Tokenizer>(
          dsv4::text::Tokenizer::from_file("../shared/fixtures/tiny-a/tokenizer.json"));
    } catch (const dsv4::Error&) {
      return std::unique_ptr<dsv4::text::Tokenizer>();
    }
  }();
  return tok.get();
}

void check_round_trip(const dsv4::text::Tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text);
  const std::string decoded = tok.decode(ids);
  if (decoded != dsv4::text::to_valid_utf8(text)) __builtin_trap();
  dsv4::text::IncrementalDecoder stream(tok);
  std::string streamed;
  for (auto id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  if (streamed != decoded) __builtin_trap();
}

// Added tokens of encode(text, plain) lie outside every plain range, and the text survives.
void check_plain_ranges(const dsv4::text::Tokenizer& tok, const std::string& text,
                        const std::vector<dsv4::text::TextRange>& plain) {
  if (!dsv4::text::is_valid_utf8(text)) return;  // repaired text moves the ranges
  const auto ids = tok.encode(text, plain);
  if (tok.decode(ids) != text) __builtin_trap();
  const auto offsets = tok.token_offsets(ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!tok.is_added(ids[i])) continue;
    for (const auto& r : plain)
      if (offsets[i] < r.end && offsets[i + 1] > r.begin) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] % 7;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  using dsv4::text::chat::ThinkingMode;
  try {
    switch (which) {
      case 0: {  // a hostile tokenizer.json
        const auto tok = dsv4::text::Tokenizer::from_json(text, "fuzz/tokenizer.json");
        const auto ids = tok.encode("Hello <｜User｜> 123 你好\n");
        (void)tok.decode(ids);
        break;
      }
      case 1:  // text through the fixture tokenizer
        if (const auto* tok = fixture()) check_round_trip(*tok, text);
        break;
      case 2: {  // token ids through the decoders
        if (const auto* tok = fixture()) {
          std::vector<dsv4::text::TokenId> ids;
          for (size_t i = 0; i + 1 < text.size(); i += 2)
            ids.push_back(static_cast<uint8_t>(text[i]) | (static_cast<uint8_t>(text[i + 1]) & 1) << 8);
          const std::string whole = tok->decode(ids);
          dsv4::text::IncrementalDecoder stream(*tok);
          std::string streamed;
          for (auto id : ids) {
            const std::string piece = stream.push(id);
            if (!dsv4::text::is_valid_utf8(piece)) __builtin_trap();
            streamed += piece;
          }
          streamed += stream.finish();
          if (streamed != whole) __builtin_trap();
        }
        break;
      }
      case 3: {  // generated text through the strict parser
        dsv4::text::chat::ParseOptions o;
        o.thinking_mode = size % 2 ? ThinkingMode::kThinking : ThinkingMode::kChat;
        o.require_eos = size % 3 != 0;
        (void)dsv4::text::chat::parse_completion(text, o).to_json().dump();
        break;
      }
      case 4: {  // messages through the chat encoder
        const auto messages = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (messages.is_discarded()) break;
        dsv4::text::chat::EncodeOptions o;
        o.thinking_mode = size % 2 ? ThinkingMode::kThinking : ThinkingMode::kChat;
        o.drop_thinking = size % 3 != 0;
        const auto prompt = dsv4::text::chat::render_prompt(messages, o);
        if (const auto* tok = fixture()) check_plain_ranges(*tok, prompt.text, prompt.caller);
        break;
      }
      case 5:  // text with plain ranges cut from the input's own bytes, and the bounded encode
        if (const auto* tok = fixture()) {
          std::vector<dsv4::text::TextRange> plain;
          for (size_t i = 0; i + 1 < text.size() && i < 16; i += 2) {
            const size_t begin = std::max(plain.empty() ? 0 : plain.back().end, static_cast<size_t>(text[i]) % text.size());
            const size_t end = std::min(text.size(), begin + static_cast<uint8_t>(text[i + 1]) % 32);
            if (begin < end) plain.push_back({begin, end});
          }
          check_plain_ranges(*tok, text, plain);
          const auto all = tok->encode(text, plain);
          const size_t max = static_cast<uint8_t>(data[0]) % 40;
          if (tok->encode(text, plain, max).size() != std::min(max, all.size())) __builtin_trap();
        }
        break;
      case 6: {  // generated ids through the answer decoder: of the specials, only the first </think>
        if (const auto* tok = fixture()) {
          dsv4::text::IncrementalDecoder stream(*tok, dsv4::text::chat::answer_specials(*tok, ThinkingMode::kThinking, false));
          const auto think_end = tok->token_id(dsv4::text::chat::kThinkEnd);
          std::vector<dsv4::text::TokenId> shown;
          std::string streamed;
          bool reasoning = true;
          for (size_t i = 0; i + 1 < text.size(); i += 2) {
            const dsv4::text::TokenId id = static_cast<uint8_t>(text[i]) | (static_cast<uint8_t>(text[i + 1]) & 1) << 8;
            streamed += stream.push(id);
            if (!tok->is_special(id) || (id == think_end && reasoning)) shown.push_back(id);
            if (id == think_end) reasoning = false;
          }
          streamed += stream.finish();
          if (streamed != tok->decode(shown)) __builtin_trap();
        }
        break;
      }
    }
  } catch (const dsv4::Error&) {
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
