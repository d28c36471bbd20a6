#include "dsv4/text/bpe_model.h"

#include <queue>

namespace dsv4::text {

BpeModel::BpeModel(const std::array<TokenId, 256>& byte_tokens, FlatPairMap<Merge> merges,
                   const FlatStringMap* whole_words)
    : merges_(std::move(merges)), byte_token_(byte_tokens), whole_words_(whole_words), cache_(new CacheShard[kCacheShards]) {}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.size() > kMaxCachedWordBytes) {
    merge_word(word, out);
    return;
  }
  const size_t hash = StringHash{}(word);
  CacheShard& shard = cache_[hash % kCacheShards];
  {
    std::lock_guard lock(shard.mutex);
    auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  std::vector<TokenId> ids(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
  std::lock_guard lock(shard.mutex);
  // Bounded: a full shard is emptied rather than tracked for recency (cheap, and a shard refills
  // with the current text's frequent words within a few kilobytes).
  if (shard.words.size() >= kShardCapacity) shard.words.clear();
  shard.words.emplace(std::string(word), std::move(ids));
}

size_t BpeModel::cached_words() const {
  size_t n = 0;
  for (size_t i = 0; i < kCacheShards; ++i) {
    std::lock_guard lock(cache_[i].mutex);
    n += cache_[i].words.size();
  }
  return n;
}

// The Hugging Face merge loop: repeatedly apply the adjacent pair with the lowest merge rank,
// leftmost first, using a priority queue whose stale entries are recognised and skipped (an
// entry is stale when the pair at its position no longer merges into the same token).
void BpeModel::merge_word(std::string_view word, std::vector<TokenId>& out) const {
  if (whole_words_) {
    if (const TokenId id = whole_words_->find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Symbol {
    TokenId id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (char c : word) {
    const TokenId id = byte_token_[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // a byte with no token is dropped, as Hugging Face does without unk
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, true});
    if (n > 0) symbols[static_cast<size_t>(n - 1)].next = n;
  }
  if (symbols.size() > 1) {
    struct Candidate {
      uint32_t rank;
      int32_t pos;
      TokenId result;
    };
    const auto later = [](const Candidate& a, const Candidate& b) {
      return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
    const auto consider = [&](int32_t pos) {
      const Symbol& s = symbols[static_cast<size_t>(pos)];
      if (s.next < 0) return;
      if (const Merge* m = merges_.find(pair_key(s.id, symbols[static_cast<size_t>(s.next)].id)))
        queue.push({m->rank, pos, m->result});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[static_cast<size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      const int32_t right_pos = left.next;
      Symbol& right = symbols[static_cast<size_t>(right_pos)];
      const Merge* m = merges_.find(pair_key(left.id, right.id));
      if (!m || m->result != top.result) continue;
      left.id = top.result;
      left.next = right.next;
      right.alive = false;
      if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0) consider(left.prev);
      consider(top.pos);
    }
  }
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

}  // namespace dsv4::text
