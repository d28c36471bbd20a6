// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (the DeepSeek-V3/V4 family).
//
// Supported components (anything else is refused at load with an Error naming the file and field):
//   model          BPE; vocab; merges as "a b" strings or ["a", "b"] pairs; ignore_merges;
//                  no dropout, no byte_fallback, no subword prefix/suffix
//   added_tokens   matched in the text before pre-tokenization, leftmost-longest, tokens with
//                  normalized=false first (as Hugging Face does); single_word/lstrip/rstrip false
//   normalizer     null or an empty Sequence
//   pre_tokenizer  Split(Regex or String, behavior Isolated, invert false) and
//                  ByteLevel(add_prefix_space false, use_regex false), alone or in a Sequence
//   post_processor null or ByteLevel (neither adds tokens: encode never adds BOS/EOS)
//   decoder        ByteLevel
//
// Text that is not valid UTF-8 is first repaired: every maximal ill-formed subpart becomes U+FFFD
// (see utf8.h), the same string JavaScript's TextDecoder would hand to Hugging Face tokenizers.
//
// Thread safety: a loaded Tokenizer is immutable except for its internal word cache, which is
// guarded; encode/decode may be called from many threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

using TokenId = int32_t;

// Bytes [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const TextRange&) const = default;
};

class IncrementalDecoder;

class Tokenizer {
 public:
  // Loads `path` (tokenizer.json). If a tokenizer_config.json sits next to it, its bos_token and
  // eos_token name the BOS/EOS tokens; otherwise bos_id()/eos_id() are empty.
  static Tokenizer from_file(const std::string& path);
  // Parses tokenizer.json text; `source` names it in errors. `config_json` is the optional text
  // of tokenizer_config.json (empty = none).
  static Tokenizer from_json(std::string_view json, const std::string& source, std::string_view config_json = {},
                             const std::string& config_source = "tokenizer_config.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`. Added-token strings written in the text (e.g. "<｜User｜>") become their
  // ids, as Hugging Face does; nothing is added around the text (no BOS).
  std::vector<TokenId> encode(std::string_view text) const;

  // The encoding of a prompt built around a caller's text, which must not become control
  // tokens: added-token text is recognised only where it lies entirely outside the `plain`
  // ranges (sorted, non-overlapping); inside them it is ordinary text. The text between the
  // recognised tokens is tokenized exactly as encode() does, so a prompt whose plain ranges hold
  // no added-token text gets encode()'s tokens.
  // Stops after `max_tokens` tokens, having done work in proportion to max_tokens rather than to
  // the text's size: a result of max_tokens tokens only says "at least this many" (its last tokens
  // need not be the full encoding's). Ask for limit + 1 to learn whether a text fits a limit.
  std::vector<TokenId> encode(std::string_view text, std::span<const TextRange> plain,
                              size_t max_tokens = SIZE_MAX) const;
  // encode() with every added-token string taken as ordinary text (no control tokens at all).
  std::vector<TokenId> encode_plain(std::string_view text, size_t max_tokens = SIZE_MAX) const;

  // The text of `ids`; bytes that do not form valid UTF-8 come out as U+FFFD. Throws Error for an
  // id that names no token. With skip_special, tokens marked "special" are left out.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // The raw bytes one token stands for (for an added token: its text). Throws Error if unknown.
  std::string token_bytes(TokenId id) const;
  // Where each token's bytes begin in the bytes of all `ids`, and then their total (ids.size() + 1
  // offsets). Throws Error for an unknown id.
  std::vector<size_t> token_offsets(std::span<const TokenId> ids) const;

  // The id of an added token by its text (e.g. "<｜User｜>"), else of a vocabulary entry by its
  // tokenizer.json spelling (e.g. "Ġthe"); nothing if neither exists.
  std::optional<TokenId> token_id(std::string_view token) const;
  // As token_id, but throws Error("<what> ... not in the vocabulary") when absent.
  TokenId require_token_id(std::string_view token) const;

  // The tokenizer.json spelling of a token (added-token text or vocabulary key).
  std::string token_string(TokenId id) const;
  bool is_special(TokenId id) const;
  bool is_added(TokenId id) const;
  bool contains(TokenId id) const;

  // One past the highest id (Hugging Face get_vocab_size(with_added_tokens = true)).
  TokenId vocab_size() const;

  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;

  // Entries in the bounded per-word BPE cache (for tests and benchmarks).
  size_t cached_words() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class IncrementalDecoder;
};

// Streaming detokenizer: push ids one at a time and receive only complete UTF-8 text. The
// concatenation of every push() and the final finish() equals Tokenizer::decode of all ids
// (of those it shows, when it leaves special tokens out).
// Keeps a reference to the tokenizer, which must outlive it.
class IncrementalDecoder {
 public:
  // Which special tokens come out as text (the others come out as nothing); null: all of them.
  using ShowSpecial = std::function<bool(TokenId)>;

  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  IncrementalDecoder(const Tokenizer& tokenizer, ShowSpecial show_special);

  // Text that became complete with this token (may be empty while a character is split over
  // several tokens). Throws Error for an unknown id.
  std::string push(TokenId id);
  // Whatever is still pending: an incomplete trailing character comes out as U+FFFD.
  std::string finish();
  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  ShowSpecial show_special_;
  std::string pending_;
};

}  // namespace dsv4::text
