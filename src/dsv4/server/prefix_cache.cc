#include "dsv4/server/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "dsv4/model/session_io.h"

namespace dsv4::server {
namespace {

bool starts_with(std::span<const int32_t> seq, std::span<const int32_t> prefix) {
  return prefix.size() <= seq.size() && std::equal(prefix.begin(), prefix.end(), seq.begin());
}

// A compressor's entries past the first `from` rows (all of them when `from` is 0).
void copy_rows_from(const CompressorState& whole, int64_t from, CompressorState& part) {
  part.pending_kv = whole.pending_kv;
  part.pending_gate = whole.pending_gate;
  part.previous_kv = whole.previous_kv;
  part.previous_gate = whole.previous_gate;
  part.has_previous = whole.has_previous;
  part.n_entries = whole.n_entries;
  const size_t row = whole.n_entries > 0 ? whole.entries.size() / static_cast<size_t>(whole.n_entries) : 0;
  part.entries.assign(whole.entries.begin() + static_cast<ptrdiff_t>(row * static_cast<size_t>(from)), whole.entries.end());
}

// Whether `whole` went through the parent's state: the same layers, at least as many entries,
// and the parent's own rows equal to the same rows of `whole` (a cheap check that the chain
// is what the tokens say; the rows before them were checked when the parent was stored).
bool extends(const SessionState& whole, const SessionState& parent) {
  if (whole.layers.size() != parent.layers.size()) return false;
  auto same_rows = [](const CompressorState& w, const CompressorState& p) {
    if (p.n_entries > w.n_entries) return false;
    if (p.n_entries == 0) return p.entries.empty();
    const size_t row = w.entries.size() / static_cast<size_t>(w.n_entries);
    if (row * static_cast<size_t>(w.n_entries) != w.entries.size() || p.entries.size() % std::max<size_t>(row, 1) != 0)
      return false;
    const size_t end = row * static_cast<size_t>(p.n_entries);
    if (p.entries.size() > end) return false;
    return std::memcmp(w.entries.data() + (end - p.entries.size()), p.entries.data(), p.entries.size() * sizeof(float)) == 0;
  };
  for (size_t l = 0; l < whole.layers.size(); ++l)
    if (!same_rows(whole.layers[l].compressor, parent.layers[l].compressor) ||
        !same_rows(whole.layers[l].indexer, parent.layers[l].indexer))
      return false;
  return true;
}

// The part of `whole` a snapshot keeps in RAM when `base` (a snapshot `whole` went through)
// holds the rest: the compressed caches' entries past base's, and the fixed-size state. No
// tokens (the key holds them).
SessionState rows_past(const SessionState& whole, const SessionState* base) {
  SessionState part;
  part.position = whole.position;
  part.mtp = whole.mtp;
  part.layers.resize(whole.layers.size());
  for (size_t l = 0; l < whole.layers.size(); ++l) {
    part.layers[l].window_kv = whole.layers[l].window_kv;
    const LayerState* from = base ? &base->layers[l] : nullptr;
    copy_rows_from(whole.layers[l].compressor, from ? from->compressor.n_entries : 0, part.layers[l].compressor);
    copy_rows_from(whole.layers[l].indexer, from ? from->indexer.n_entries : 0, part.layers[l].indexer);
  }
  return part;
}

// Puts `base`'s rows in front of the rows of `s` (read from a disk entry that leaves them
// out). False when the two do not fit together: other layers, tokens or row sizes.
bool join(const SessionState& base, SessionState& s) {
  if (base.layers.size() != s.layers.size() || base.tokens.size() >= s.tokens.size() || !starts_with(s.tokens, base.tokens))
    return false;
  auto rows = [](const CompressorState& b, CompressorState& c) {
    if (c.n_entries < b.n_entries || b.n_entries < 0) return false;
    const size_t total = b.entries.size() + c.entries.size();
    if (c.n_entries == 0) return total == 0;
    const size_t n = static_cast<size_t>(c.n_entries);
    if (total % n != 0 || b.entries.size() != total / n * static_cast<size_t>(b.n_entries)) return false;
    c.entries.insert(c.entries.begin(), b.entries.begin(), b.entries.end());
    return true;
  };
  for (size_t l = 0; l < s.layers.size(); ++l)
    if (!rows(base.layers[l].compressor, s.layers[l].compressor) || !rows(base.layers[l].indexer, s.layers[l].indexer))
      return false;
  return true;
}

uint64_t entry_bytes(const SessionState& part, const std::vector<int32_t>& key, const std::string& text) {
  return part.bytes() + static_cast<uint64_t>(key.capacity()) * sizeof(int32_t) + text.capacity();
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
    e.own = s.own;
    e.named = s.own;
    e.block = s.block;
    e.file = s.file;
    e.parent_file = s.parent_file;
    add(std::move(e), false);
  }
}

PrefixCache::Entry& PrefixCache::add(Entry e, bool front) {
  const auto it = entries_.insert(front ? entries_.begin() : entries_.end(), std::move(e));
  it->self = it;
  index_.insert(it->key, &*it);
  return *it;
}

PrefixCache::List::iterator PrefixCache::erase(List::iterator it) {
  index_.erase(it->key, &*it);
  return entries_.erase(it);
}

PrefixCache::Entry* PrefixCache::find(std::span<const int32_t> key) {
  Entry* found = nullptr;
  index_.prefixes_of(key, [&](size_t depth, Entry* e) {
    if (!found && depth == key.size()) found = e;
  });
  return found;
}

std::optional<PrefixCache::Match> PrefixCache::longest_token_prefix(std::span<const int32_t> prompt) {
  for (;;) {
    // The deepest key on the prompt's path whose session leaves a token to feed (of equal
    // keys, the first added).
    Entry* best = nullptr;
    index_.prefixes_of(prompt, [&](size_t depth, Entry* e) {
      if (e->state_tokens < prompt.size() && (!best || best->key.size() < depth)) best = e;
    });
    if (!best) return std::nullopt;
    if (auto m = take(best->self)) return m;  // else its disk entry was bad and is gone: look again
  }
}

size_t PrefixCache::longest_shared_prefix(std::span<const int32_t> prompt) const {
  return index_.shared_prefix(prompt);
}

std::optional<size_t> PrefixCache::store_index(const Entry& e) const {
  if (!store_ || e.file.empty()) return std::nullopt;
  return store_->find(e.file);
}

void PrefixCache::touch(List::iterator it) {
  for (Entry* e = &*it; e; e = e->parent) {  // each parent ends up before its children
    entries_.splice(entries_.begin(), entries_, e->self);
    if (e->part) e->priority = clock_ + saved_per_byte(*e);
  }
}

double PrefixCache::saved_per_byte(const Entry& e) {
  // The prefill its part saves beyond its parent's, per byte held.
  const size_t above = e.parent ? e.parent->state_tokens : 0;
  return static_cast<double>(e.state_tokens - above) / static_cast<double>(std::max<uint64_t>(e.bytes, 1));
}

SessionState PrefixCache::whole(const Entry& e) const {
  std::vector<const Entry*> chain;  // e first, the root of its chain last
  for (const Entry* x = &e; x; x = x->parent) chain.push_back(x);
  SessionState s = *e.part;
  s.tokens.assign(e.key.begin(), e.key.begin() + static_cast<ptrdiff_t>(e.state_tokens));
  if (chain.size() == 1) return s;
  auto join = [&](auto member, size_t l) {
    std::vector<float>& out = (s.layers[l].*member).entries;
    size_t total = 0;
    for (const Entry* x : chain) total += (x->part->layers[l].*member).entries.size();
    std::vector<float> rows;
    rows.reserve(total);
    for (auto x = chain.rbegin(); x != chain.rend(); ++x) {
      const std::vector<float>& r = ((*x)->part->layers[l].*member).entries;
      rows.insert(rows.end(), r.begin(), r.end());
    }
    out = std::move(rows);
  };
  for (size_t l = 0; l < s.layers.size(); ++l) {
    join(&LayerState::compressor, l);
    join(&LayerState::indexer, l);
  }
  return s;
}

std::optional<PrefixCache::Match> PrefixCache::take(List::iterator it) {
  touch(it);  // now the most recently used, with its chain
  Entry& e = *it;
  if (e.part) {
    if (auto i = store_index(e)) store_->touch(*i);
    return Match{whole(e), e.key, e.text};
  }
  std::optional<SessionState> loaded = load(e);
  if (!loaded) {
    prune();  // e, and any block snapshot of its chain that failed
    return std::nullopt;
  }
  Match m{std::move(*loaded), e.key, e.text};
  if (hold(e, m.state)) touch(it);
  evict();
  return m;
}

std::optional<SessionState> PrefixCache::load(Entry& e) {
  const auto i = store_index(e);
  std::optional<SessionState> s;
  if (i) s = store_->load(*i);
  if (!s) {  // the store has dropped it (and said why)
    e.file.clear();
    return std::nullopt;
  }
  if (e.parent_file.empty()) return s;
  auto bad = [&](const std::string& why) -> std::optional<SessionState> {
    if (auto j = store_index(e)) store_->remove(*j, why);
    e.file.clear();
    return std::nullopt;
  };
  auto p = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.file == e.parent_file; });
  if (p == entries_.end()) return bad("its block snapshot is gone");
  std::optional<SessionState> base = p->part ? std::optional<SessionState>(whole(*p)) : load(*p);
  if (!base) return bad("its block snapshot could not be read");
  if (!join(*base, *s)) return bad("its rows do not continue its block snapshot's");
  if (!p->part) hold(*p, *base);  // the next prompt through this block finds it in RAM
  return s;
}

void PrefixCache::prune() {
  for (auto it = entries_.begin(); it != entries_.end();) it = it->part || !it->file.empty() ? std::next(it) : erase(it);
}

bool PrefixCache::hold(Entry& e, const SessionState& state) {
  if (max_entries_ == 0) return false;
  // The deepest block snapshot held in RAM whose tokens this session went through.
  Entry* parent = nullptr;
  index_.prefixes_of(state.tokens, [&](size_t, Entry* p) {
    if (!p->block || !p->part || p == &e || p->state_tokens >= state.tokens.size()) return;
    if (parent && parent->state_tokens >= p->state_tokens) return;
    if (extends(state, *p->part)) parent = p;
  });
  SessionState part = rows_past(state, parent ? &*parent->part : nullptr);
  const uint64_t bytes = entry_bytes(part, e.key, e.text);
  if (bytes > max_bytes_) return false;
  e.part = std::move(part);
  e.parent = parent;
  if (parent) ++parent->children;
  e.bytes = bytes;
  bytes_ += bytes;
  if (e.named) ++ram_entries_;
  return true;
}

PrefixCache::List::iterator PrefixCache::release(List::iterator it) {
  Entry& e = *it;
  if (e.part) {
    bytes_ -= e.bytes;
    if (e.named) --ram_entries_;
    if (e.parent) --e.parent->children;
    e.part.reset();
    e.parent = nullptr;
    e.bytes = 0;
  }
  if (e.file.empty()) return erase(it);
  e.named = e.own;  // on disk: counted as a request's snapshot again when it is read back
  return std::next(it);
}

void PrefixCache::insert(const SessionState& state, std::span<const int32_t> tail, std::string text) {
  if (state.tokens.empty()) return;
  std::vector<int32_t> key = state.tokens;
  key.insert(key.end(), tail.begin(), tail.end());
  if (Entry* same = find(key)) {
    const auto it = same->self;
    if (it->state_tokens != state.tokens.size()) {
      // The same key for another session of it (a block snapshot that went one token further,
      // where this one keeps the token as its tail): either serves; the one there stays.
      touch(it);
      return;
    }
    if (!it->named) {  // a block snapshot becomes a request's too
      it->own = it->named = true;
      if (it->part) ++ram_entries_;
      it->unsaved = store_ != nullptr && it->file.empty();
      if (it->text.empty()) it->text = std::move(text);
    }
    if (!it->part) hold(*it, state);
    touch(it);
    evict();
    return;
  }
  Entry e;
  e.state_tokens = state.tokens.size();
  e.key = std::move(key);
  e.text = std::move(text);
  e.own = e.named = true;
  e.unsaved = store_ != nullptr;
  Entry& added = add(std::move(e));
  if (hold(added, state)) {
    touch(added.self);
    evict();
    return;
  }
  if (store_) {
    // Too big for RAM (or no RAM tier): straight to disk.
    std::vector<std::string> removed;
    write(added, &state, removed);
    if (added.file.empty()) erase(added.self);
    forget_files(removed);
    return;
  }
  erase(added.self);
}

void PrefixCache::insert_block(const SessionState& state) {
  if (state.tokens.empty()) return;
  if (Entry* same = find(state.tokens)) {
    // (One whose key holds a tail is another session: its key, and so its file name, is taken.)
    if (same->state_tokens != state.tokens.size()) return;
    same->block = true;
    if (!same->part) hold(*same, state);
    touch(same->self);
    evict();
    return;
  }
  Entry e;
  e.key = state.tokens;
  e.state_tokens = state.tokens.size();
  e.block = true;
  e.unsaved = store_ != nullptr;
  Entry& added = add(std::move(e));
  if (!hold(added, state)) {
    erase(added.self);
    return;
  }
  touch(added.self);
  evict();
}

void PrefixCache::write(Entry& e, const SessionState* state, std::vector<std::string>& removed) {
  e.unsaved = false;
  if (!store_) return;
  // The file leaves out the rows of the deepest block snapshot above it that is on disk
  // (written first if it is not yet).
  Entry* base = nullptr;
  for (Entry* a = e.parent; a && !base; a = a->parent) {
    if (a->unsaved && a->part) write(*a, nullptr, removed);
    if (a->file.empty() || std::find(removed.begin(), removed.end(), a->file) != removed.end()) continue;
    const auto i = store_index(*a);  // (on disk as a block snapshot: one stored first as a
    if (i && store_->entries()[*i].block) base = a;  // request's own cannot be a parent there)
  }
  const SessionState* out = state;  // without a part in RAM, the session given (it has no parent)
  SessionState saved;
  if (e.part) {
    if (base && base == e.parent)
      saved = *e.part;  // exactly its rows past the parent
    else
      saved = base ? rows_past(whole(e), &*base->part) : whole(e);
    saved.tokens.assign(e.key.begin(), e.key.begin() + static_cast<ptrdiff_t>(e.state_tokens));
    out = &saved;
  }
  const std::span<const int32_t> tail = std::span<const int32_t>(e.key).subspan(e.state_tokens);
  const StoreLinks links{base ? base->file : std::string(), e.block, e.own};
  PrefixStore::Stored stored = store_->store(*out, tail, e.text, links);
  removed.insert(removed.end(), stored.removed.begin(), stored.removed.end());
  e.file = std::move(stored.file);
  // As the store has it (another server sharing the directory may have written it first).
  const auto i = store_index(e);
  e.parent_file = i ? store_->entries()[*i].parent_file : std::string();
}

void PrefixCache::persist() {
  std::vector<std::string> removed;
  for (Entry& e : entries_)
    if (e.unsaved && e.part) write(e, nullptr, removed);
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
      it->named = it->named && it->part;
      it = it->part ? std::next(it) : erase(it);
    }
  }
}

void PrefixCache::evict() {
  // GreedyDual-Size: the victim has the lowest priority, set on each use to the clock plus
  // the prefill its part saves per byte; each eviction moves the clock up to the victim's, so
  // an entry not used for a while loses to fresh ones however much it saves. Ties go to the
  // least recently used. Beyond the entry bound the victim is a request's snapshot; one with
  // block snapshots below it stays (they need its rows) but stops counting as a request's.
  // Beyond the byte bound it is a snapshot with none below it (a chain is dropped from its
  // leaves up). An entry on disk stays indexed (one not written yet is written first, so the
  // RAM bound holds at every moment).
  std::vector<std::string> removed;
  for (;;) {
    const bool over_entries = ram_entries_ > max_entries_, over_bytes = bytes_ > max_bytes_;
    if (!over_entries && !over_bytes) break;
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (!it->part || (over_entries ? !it->named : it->children > 0)) continue;
      if (victim == entries_.end() || it->priority <= victim->priority) victim = it;
    }
    if (victim == entries_.end()) break;  // (not reached: whatever is counted is held)
    Entry& e = *victim;
    clock_ = std::max(clock_, e.priority);
    if (e.unsaved) write(e, nullptr, removed);
    if (e.children > 0) {
      e.named = false;
      --ram_entries_;
      continue;
    }
    release(victim);
  }
  forget_files(removed);
}

void PrefixCache::clear() {
  entries_.clear();
  index_.clear();
  bytes_ = 0;
  ram_entries_ = 0;
}

}  // namespace dsv4::server
