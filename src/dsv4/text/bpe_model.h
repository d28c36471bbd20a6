// The BPE model of a byte-level tokenizer: vocabulary, merge ranks, and the merge loop that turns
// one pre-tokenized word (raw bytes) into token ids, with a bounded cache of recent words.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dsv4/text/flat_string_map.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

class BpeModel {
 public:
  struct Merge {
    uint32_t rank = 0;
    TokenId result = -1;
  };

  // `byte_tokens[b]` is the id of the one-byte token b (-1 if none). `merges` maps (left id,
  // right id) packed by pair_key() to its rank and result. `whole_words` (raw bytes → id; only
  // consulted with ignore_merges) must outlive the model.
  BpeModel(const std::array<TokenId, 256>& byte_tokens, FlatPairMap<Merge> merges, const FlatStringMap* whole_words);

  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // Appends the ids of one word (raw bytes). Thread-safe.
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  size_t cached_words() const;

  // Words up to this many bytes are cached; the cache holds at most kCacheShards * kShardCapacity.
  static constexpr size_t kMaxCachedWordBytes = 64;
  static constexpr size_t kCacheShards = 64;
  static constexpr size_t kShardCapacity = 4096;

 private:
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;

  FlatPairMap<Merge> merges_;
  std::array<TokenId, 256> byte_token_{};  // id of each single byte, -1 if absent
  const FlatStringMap* whole_words_;       // non-null = ignore_merges

  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> words;
  };
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace dsv4::text
