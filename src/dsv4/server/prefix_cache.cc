#include "dsv4/server/prefix_cache.h"

#include <algorithm>

namespace dsv4::server {
namespace {

template <typename T>
uint64_t vector_bytes(const std::vector<T>& v) {
  return static_cast<uint64_t>(v.capacity()) * sizeof(T);
}

}  // namespace

PrefixCache::PrefixCache(size_t max_entries, uint64_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

std::optional<PrefixCache::Match> PrefixCache::longest_token_prefix(std::span<const int32_t> prompt) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const auto& k = it->key;
    if (k.size() > prompt.size() || it->state.tokens.size() >= prompt.size()) continue;
    if (best != entries_.end() && best->key.size() >= k.size()) continue;
    if (std::equal(k.begin(), k.end(), prompt.begin())) best = it;
  }
  return take(best);
}

std::optional<PrefixCache::Match> PrefixCache::take(List::iterator it) {
  if (it == entries_.end()) return std::nullopt;
  entries_.splice(entries_.begin(), entries_, it);  // now the most recently used
  return Match{it->state, it->key, it->text};
}

void PrefixCache::insert(SessionState state, std::span<const int32_t> tail, std::string text) {
  if (max_entries_ == 0 || state.tokens.empty()) return;
  std::vector<int32_t> key = state.tokens;
  key.insert(key.end(), tail.begin(), tail.end());
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key == key) {
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  }
  Entry e;
  e.bytes = state.bytes() + vector_bytes(key) + text.capacity();
  if (e.bytes > max_bytes_) return;
  e.state = std::move(state);
  e.key = std::move(key);
  e.text = std::move(text);
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
  evict();
}

void PrefixCache::evict() {
  while (!entries_.empty() && (entries_.size() > max_entries_ || bytes_ > max_bytes_)) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

void PrefixCache::clear() {
  entries_.clear();
  bytes_ = 0;
}

}  // namespace dsv4::server
