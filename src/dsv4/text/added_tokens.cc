#include "dsv4/text/added_tokens.h"

#include <algorithm>

namespace dsv4::text {

AddedTokenMatcher::AddedTokenMatcher() : nodes_(1) { root_.fill(-1); }

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_[byte];
  for (const auto& [b, next] : nodes_[static_cast<size_t>(node)].children)
    if (b == byte) return next;
  return -1;
}

void AddedTokenMatcher::add(std::string_view content, TokenId id) {
  int32_t node = 0;
  for (char c : content) {
    const auto byte = static_cast<uint8_t>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      if (node == 0)
        root_[byte] = next;
      else
        nodes_[static_cast<size_t>(node)].children.emplace_back(byte, next);
    }
    node = next;
  }
  nodes_[static_cast<size_t>(node)].token = id;
  longest_ = std::max(longest_, content.size());
}

AddedTokenMatcher::Match AddedTokenMatcher::find(std::string_view text, size_t from) const {
  for (size_t i = from; i < text.size(); ++i) {
    int32_t node = root_[static_cast<uint8_t>(text[i])];
    if (node < 0) continue;
    Match best{0, 0, -1};
    for (size_t j = i + 1;; ++j) {
      if (nodes_[static_cast<size_t>(node)].token >= 0) best = {i, j, nodes_[static_cast<size_t>(node)].token};
      if (j >= text.size()) break;
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
    }
    if (best.end != 0) return best;
  }
  return {0, 0, -1};
}

}  // namespace dsv4::text
