#include "dsv4/constrain/token_trie.h"

#include <algorithm>

#include "dsv4/util/error.h"

namespace dsv4::constrain {

TokenTrie::TokenTrie(const text::Tokenizer& tok) {
  vocab_size_ = tok.vocab_size();
  bytes_.resize(static_cast<size_t>(vocab_size_));
  ordinary_.assign(static_cast<size_t>(vocab_size_), 0);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!tok.contains(id)) continue;
    const std::string b = tok.token_bytes(id);
    if (tok.is_added(id)) {
      added_.emplace_back(b, id);
      continue;
    }
    if (b.empty() || b.size() > 255) continue;  // cannot be spelled by a walk of depth <= 255
    bytes_[static_cast<size_t>(id)].assign(b.begin(), b.end());
    ordinary_[static_cast<size_t>(id)] = 1;
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    if (bytes_[a] != bytes_[b]) return bytes_[a] < bytes_[b];
    return a < b;
  });
  // Sorted byte strings give the depth-first order: each one adds nodes for what it does not
  // share with the previous one. A second id with the same bytes gets no node (the first
  // one stands for it; byte-level BPE vocabularies have none).
  std::vector<uint8_t> prev;
  std::vector<uint32_t> open;  // node index at each depth of the current path
  for (int32_t id : ids) {
    const auto& b = bytes_[id];
    size_t common = 0;
    while (common < prev.size() && common < b.size() && prev[common] == b[common]) ++common;
    if (common == b.size() && common == prev.size()) {
      ordinary_[static_cast<size_t>(id)] = 0;
      continue;
    }
    while (open.size() > common) {
      nodes_[open.back()].skip = static_cast<uint32_t>(nodes_.size());
      open.pop_back();
    }
    for (size_t d = common; d < b.size(); ++d) {
      open.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back(Node{0, -1, b[d], static_cast<uint8_t>(d + 1)});
    }
    nodes_.back().token = id;
    max_depth_ = std::max(max_depth_, b.size());
    prev = b;
  }
  while (!open.empty()) {
    nodes_[open.back()].skip = static_cast<uint32_t>(nodes_.size());
    open.pop_back();
  }
}

std::optional<int32_t> TokenTrie::added_token(std::string_view text) const {
  for (const auto& [t, id] : added_)
    if (t == text) return id;
  return std::nullopt;
}

size_t TokenTrie::memory_bytes() const {
  size_t bytes = nodes_.size() * sizeof(Node) + ordinary_.size() + bytes_.size() * sizeof(bytes_[0]);
  for (const auto& b : bytes_) bytes += b.capacity();
  return bytes;
}

}  // namespace dsv4::constrain
