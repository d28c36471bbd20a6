// Internal state of a loaded Tokenizer, shared by the loader (tokenizer_loader.cc) and the
// encode/decode code (tokenizer.cc). Not part of the public interface.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsv4/text/added_tokens.h"
#include "dsv4/text/bpe_model.h"
#include "dsv4/text/flat_string_map.h"
#include "dsv4/text/pre_tokenizer.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::text {

struct Tokenizer::Impl {
  std::string source;  // file name, for error messages

  std::unique_ptr<BpeModel> bpe;
  RegexSplitter splitter;
  // Added tokens are looked for in two passes, as Hugging Face does: first those declared with
  // normalized=false, then (in the remaining text) those with normalized=true.
  AddedTokenMatcher raw_added;
  AddedTokenMatcher normalized_added;

  // Every token's spelling and bytes live in two arenas (one allocation each instead of 2 × 128k);
  // the per-id views and the indexes point into them, so an Impl never moves (it is held by
  // unique_ptr) and the arenas are never appended to after the views are taken.
  std::string spelling_arena;
  std::string bytes_arena;

  // Per id (index = id); absent ids have present[id] == false.
  std::vector<bool> present;
  std::vector<bool> added;
  std::vector<bool> special;
  std::vector<std::string_view> spelling;  // tokenizer.json spelling (vocab key or added-token text)
  std::vector<std::string_view> bytes;     // what the ByteLevel decoder turns the token into

  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> added_by_text;
  FlatStringMap vocab_by_spelling;  // vocabulary entries only
  FlatStringMap vocab_by_bytes;     // byte-level vocabulary entries by raw bytes (for ignore_merges)

  std::optional<TokenId> bos;
  std::optional<TokenId> eos;

  // What bounds a bounded encode: when every byte has a token, n bytes of text make at least
  // n / longest_token_bytes tokens (n / longest_word_bytes within one pre-tokenized word).
  bool every_byte = false;
  size_t longest_token_bytes = 1;  // the most bytes any token stands for, added tokens included
  size_t longest_word_bytes = 1;   // ... any vocabulary token (what BPE can produce)
  std::array<TokenId, 256> byte_tokens{};

  std::string_view bytes_of(TokenId id) const;
};

// Parses tokenizer.json (and optionally tokenizer_config.json) into a ready Impl. `padded` must
// be followed by at least simdjson::SIMDJSON_PADDING readable bytes (a simdjson::padded_string).
std::unique_ptr<Tokenizer::Impl> load_tokenizer(std::string_view padded, const std::string& source,
                                                std::string_view config_json, const std::string& config_source);

}  // namespace dsv4::text
