#include "dsv4/server/prefix_cache.h"

#include <algorithm>

#include "dsv4/model/session_io.h"

namespace dsv4::server {
namespace {

uint64_t entry_bytes(const SessionState& s, const std::vector<int32_t>& key, const std::string& text) {
  return s.bytes() + static_cast<uint64_t>(key.capacity()) * sizeof(int32_t) + text.capacity();
}

}  // namespace

PrefixCache::PrefixCache(size_t max_entries, uint64_t max_bytes, std::unique_ptr<PrefixStore> store)
    : max_entries_(max_entries), max_bytes_(max_bytes), store_(std::move(store)) {
  if (!store_) return;
  for (const StoredPrefix& s : store_->entries()) {  // most recently used first
    Entry e;
    e.key = s.key;
    e.state_tokens = s.state_tokens;
    e.text = s.text;
    e.file = s.file;
    entries_.push_back(std::move(e));
  }
}

std::optional<PrefixCache::Match> PrefixCache::longest_token_prefix(std::span<const int32_t> prompt) {
  for (;;) {
    auto best = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const auto& k = it->key;
      if (k.size() > prompt.size() || it->state_tokens >= prompt.size()) continue;
      if (best != entries_.end() && best->key.size() >= k.size()) continue;
      if (std::equal(k.begin(), k.end(), prompt.begin())) best = it;
    }
    if (best == entries_.end()) return std::nullopt;
    if (auto m = take(best)) return m;  // else its disk entry was bad and is gone: look again
  }
}

std::optional<size_t> PrefixCache::store_index(const Entry& e) const {
  if (!store_ || e.file.empty()) return std::nullopt;
  const auto& stored = store_->entries();
  for (size_t i = 0; i < stored.size(); ++i)
    if (stored[i].file == e.file) return i;
  return std::nullopt;
}

std::optional<PrefixCache::Match> PrefixCache::take(List::iterator it) {
  entries_.splice(entries_.begin(), entries_, it);  // now the most recently used
  Entry& e = *it;
  if (e.state) {
    if (auto i = store_index(e)) store_->touch(*i);
    return Match{*e.state, e.key, e.text};
  }
  std::optional<SessionState> loaded;
  if (auto i = store_index(e)) loaded = store_->load(*i);
  if (!loaded) {
    entries_.erase(it);
    return std::nullopt;
  }
  Match m{*loaded, e.key, e.text};
  hold(e, *loaded);
  evict();
  return m;
}

void PrefixCache::hold(Entry& e, SessionState& state) {
  const uint64_t bytes = entry_bytes(state, e.key, e.text);
  if (max_entries_ == 0 || bytes > max_bytes_) return;
  e.state = std::move(state);
  e.bytes = bytes;
  bytes_ += bytes;
  ++ram_entries_;
}

void PrefixCache::insert(SessionState state, std::span<const int32_t> tail, std::string text) {
  if (state.tokens.empty()) return;
  std::vector<int32_t> key = state.tokens;
  key.insert(key.end(), tail.begin(), tail.end());
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key != key) continue;
    entries_.splice(entries_.begin(), entries_, it);
    if (!it->state) hold(*it, state);
    evict();
    return;
  }
  Entry e;
  e.state_tokens = state.tokens.size();
  e.key = std::move(key);
  e.text = std::move(text);
  e.unsaved = store_ != nullptr;
  entries_.push_front(std::move(e));
  Entry& front = entries_.front();
  hold(front, state);
  if (front.state) {
    evict();
    return;
  }
  if (store_) {
    // Too big for RAM (or no RAM tier): straight to disk.
    front.state = std::move(state);
    std::vector<std::string> removed;
    write(front, removed);
    front.state.reset();
    const bool stored = !front.file.empty();
    if (!stored) entries_.pop_front();
    forget_files(removed);
    return;
  }
  entries_.pop_front();
}

void PrefixCache::write(Entry& e, std::vector<std::string>& removed) {
  e.unsaved = false;
  if (!store_ || !e.state) return;
  const std::span<const int32_t> tail = std::span<const int32_t>(e.key).subspan(e.state_tokens);
  PrefixStore::Stored stored = store_->store(*e.state, tail, e.text);
  removed.insert(removed.end(), stored.removed.begin(), stored.removed.end());
  e.file = std::move(stored.file);
}

void PrefixCache::persist() {
  std::vector<std::string> removed;
  for (Entry& e : entries_)
    if (e.unsaved) write(e, removed);
  forget_files(removed);
}

void PrefixCache::forget_files(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->file != f) {
        ++it;
        continue;
      }
      it->file.clear();
      it = it->state ? std::next(it) : entries_.erase(it);
    }
  }
}

void PrefixCache::evict() {
  // Drop RAM sessions from the least recently used end; an entry on disk stays indexed (one not
  // written yet is written first, so the RAM bound holds at every moment).
  std::vector<std::string> removed;
  for (auto it = entries_.end(); it != entries_.begin() && (ram_entries_ > max_entries_ || bytes_ > max_bytes_);) {
    --it;
    if (!it->state) continue;
    if (it->unsaved) write(*it, removed);
    bytes_ -= it->bytes;
    --ram_entries_;
    it->state.reset();
    it->bytes = 0;
    if (it->file.empty()) it = entries_.erase(it);
  }
  forget_files(removed);
}

void PrefixCache::clear() {
  entries_.clear();
  bytes_ = 0;
  ram_entries_ = 0;
}

}  // namespace dsv4::server
