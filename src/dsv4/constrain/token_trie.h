// The model's vocabulary as a byte trie, built once per tokenizer: every ordinary token's byte
// string (byte-level BPE tokens often straddle several JSON lexemes, e.g. `"},` or `":"`, so
// tokens are checked byte by byte, never by lexeme). Stored in depth-first order so that the
// walk that computes a mask is one forward pass that skips whole subtrees whose prefix the
// grammar refuses. Added tokens (special tokens) are not in the trie; a grammar names the few
// it uses (e.g. ｜DSML｜) and they are looked up by text.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "dsv4/text/tokenizer.h"

namespace dsv4::constrain {

class TokenTrie {
 public:
  struct Node {
    uint32_t skip;   // index of the next node outside this subtree
    int32_t token;   // id of the token whose bytes end here, -1 if none
    uint8_t byte;
    uint8_t depth;   // 1 for the first byte of a token
  };

  explicit TokenTrie(const text::Tokenizer& tokenizer);

  const std::vector<Node>& nodes() const { return nodes_; }
  int32_t vocab_size() const { return vocab_size_; }  // the tokenizer's (ids at or past it do not exist)
  size_t max_depth() const { return max_depth_; }
  const std::vector<uint8_t>& token_bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_ordinary(int32_t id) const { return id >= 0 && id < vocab_size_ && ordinary_[static_cast<size_t>(id)]; }
  // The id of the added token spelled `text`, if the tokenizer has one.
  std::optional<int32_t> added_token(std::string_view text) const;
  size_t memory_bytes() const;

 private:
  std::vector<Node> nodes_;
  std::vector<std::vector<uint8_t>> bytes_;  // per id (empty for added tokens)
  std::vector<uint8_t> ordinary_;
  std::vector<std::pair<std::string, int32_t>> added_;
  int32_t vocab_size_ = 0;
  size_t max_depth_ = 0;
};

}  // namespace dsv4::constrain
