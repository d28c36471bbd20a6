// Finds added tokens (special and other tokens declared in tokenizer.json "added_tokens") written
// in the text. Matching is leftmost-longest and non-overlapping, like the Aho-Corasick matcher
// Hugging Face uses; a byte trie is enough because the token set is small.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "dsv4/text/tokenizer.h"

namespace dsv4::text {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher();
  void add(std::string_view content, TokenId id);
  bool empty() const { return nodes_.size() == 1; }
  size_t longest() const { return longest_; }  // bytes of the longest token added

  struct Match {
    size_t begin;
    size_t end;
    TokenId id;
  };
  // The first (leftmost, then longest) match at or after `from`, or end == 0 if none.
  Match find(std::string_view text, size_t from) const;

 private:
  struct Node {
    TokenId token = -1;
    std::vector<std::pair<uint8_t, int32_t>> children;
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<Node> nodes_;
  std::array<int32_t, 256> root_{};  // children of the root, -1 if none (the hot lookup)
  size_t longest_ = 0;
};

}  // namespace dsv4::text
