// Session snapshots, each keyed by a token sequence, so that a request whose prompt starts with
// a cached sequence only prefills the rest (sessions cannot rewind, so a snapshot is usable
// exactly when its key is a prefix of the new prompt). A key is the session's tokens plus a
// "tail" the session has not been fed yet: a finished answer's last token is sampled but never
// fed, and the next turn's prefill feeds it anyway.
//
// Two kinds of snapshot. A request's own (insert): at its history boundary, its prompt but the
// last token, its answer; counted against the entry bound. Block
// snapshots (insert_block): every `--cache-block` tokens of every prefill, so that any two
// prompts that agree for a while share all the blocks up to where they part (the same document
// with another question, a conversation forked at an earlier turn). The snapshots form a tree
// over blocks: a snapshot holds only the compressed caches' entries past the deepest block
// snapshot its tokens extend (entries are append-only, so a block's rows are the same in every
// session that went through it), plus its own fixed-size state (window, compressor remainders,
// MTP ring); a lookup rebuilds the session from the chain. A block snapshot with descendants is
// never dropped before them, and using a snapshot marks its whole chain used.
//
// Two tiers: snapshots in RAM, bounded by bytes (all of them) and entry count (requests' own),
// dropped by recency and the prefill they save per byte (GreedyDual-Size, see evict()), and
// optionally a PrefixStore on disk (--cache-dir), bounded by its own bytes, whose entries
// survive restarts. The disk tier is deduplicated the same way: an entry's file holds only the
// rows past the deepest block snapshot above it that is on disk. A lookup considers both; a
// disk entry is read (and checked, with its chain) when it is the best match, then kept in RAM
// too, with the block snapshots of its chain. New snapshots go to RAM at once and to disk at
// the next persist(), which the scheduler calls once the request's answer is out (one that
// must leave RAM before then, or never fits there, is written at once). Not thread-safe: the
// scheduler's worker is its only user.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/model/session.h"
#include "dsv4/server/prefix_store.h"
#include "dsv4/server/token_trie.h"

namespace dsv4::server {

class PrefixCache {
 public:
  // `store`: the disk tier, or null.
  PrefixCache(size_t max_entries, uint64_t max_bytes, std::unique_ptr<PrefixStore> store = nullptr);

  struct Match {
    SessionState state;        // a copy; the cache keeps its own
    std::vector<int32_t> key;  // state.tokens + the tail
    std::string text;          // what the key decodes to (may be empty)
  };

  // The entry with the longest key that is a prefix of `prompt` (its session holding fewer
  // tokens than the prompt).
  std::optional<Match> longest_token_prefix(std::span<const int32_t> prompt);

  // The most tokens any entry's key has in common with the start of `prompt` (where the prompt
  // parts from the nearest cached one).
  size_t longest_shared_prefix(std::span<const int32_t> prompt) const;

  // The entry with the longest text that is a proper prefix of `text` and for which
  // `junction_ok(rest)` holds for the rest of the text (the caller checks that the rest
  // tokenizes on its own the way it would inside the whole text). A scan of the entries with
  // text (only requests' snapshots have it); token lookups go through the radix index.
  template <typename JunctionOk>
  std::optional<Match> longest_text_prefix(std::string_view text, JunctionOk junction_ok) {
    for (;;) {
      auto best = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->text.empty() || it->text.size() >= text.size() || !text.starts_with(it->text)) continue;
        if (best != entries_.end() && best->text.size() >= it->text.size()) continue;
        if (junction_ok(text.substr(it->text.size()))) best = it;
      }
      if (best == entries_.end()) return std::nullopt;
      if (auto m = take(best)) return m;  // else its disk entry was bad and is gone: look again
    }
  }

  // Stores a request's snapshot keyed by state.tokens + tail; `text` is what the key decodes to
  // (or empty). An entry with the same key is only refreshed. Snapshots bigger than the RAM
  // bound are not kept in RAM (but still go to disk).
  void insert(const SessionState& state, std::span<const int32_t> tail, std::string text);
  // Stores a block snapshot keyed by state.tokens (bounded by bytes in RAM; on disk too after
  // the next persist()): only the rows past the deepest block snapshot it extends are copied.
  void insert_block(const SessionState& state);
  // Writes the snapshots inserted since the last call to the disk tier (if any).
  void persist();

  size_t entries() const { return ram_entries_; }  // requests' snapshots in RAM
  uint64_t bytes() const { return bytes_; }        // in RAM, all of them
  const PrefixStore* store() const { return store_.get(); }
  void clear();

 private:
  struct Entry {
    std::vector<int32_t> key;
    size_t state_tokens = 0;
    std::string text;
    bool own = false;    // a request's snapshot
    bool named = false;  // counted in max_entries (own, unless it has block snapshots below it)
    bool block = false;  // a block snapshot: later snapshots may hold only their rows past it
    // In RAM: the session with the compressed caches' entries past the parent's only, and no
    // tokens (the key holds them).
    std::optional<SessionState> part;
    Entry* parent = nullptr;  // the block snapshot `part` extends (null: part is whole)
    size_t children = 0;      // entries whose parent this is
    uint64_t bytes = 0;       // RAM bytes while the part is held
    double priority = 0;      // eviction order, lowest first (evict())
    std::string file;         // its disk entry ("" if none)
    std::string parent_file;  // the disk entry whose rows `file` leaves out ("" if none)
    bool unsaved = false;     // to be written by persist()
    std::list<Entry>::iterator self;  // its place in entries_ (list iterators survive splices)
  };
  using List = std::list<Entry>;  // most recently used first; an entry's parent before it
  // Adds an entry at the front (or the back) of the list and to the index.
  Entry& add(Entry e, bool front = true);
  // Takes an entry out of the index and the list; returns the iterator after it.
  List::iterator erase(List::iterator it);
  // The entry with exactly this key (keys are unique: they name the disk tier's files), or null.
  Entry* find(std::span<const int32_t> key);
  // The entry's session (read from disk when not in RAM); null when that read failed, in
  // which case the entry is gone.
  std::optional<Match> take(List::iterator it);
  // An entry's whole session read from its disk chain; the block snapshots read on the way are
  // held in RAM. Null (and the entry's file gone) when a file of the chain fails its checks.
  std::optional<SessionState> load(Entry& e);
  // Erases the entries that are neither in RAM nor on disk.
  void prune();
  // Holds `state` in RAM as e's part if it fits the bounds at all (false: it does not).
  bool hold(Entry& e, const SessionState& state);
  // The whole session of an entry held in RAM.
  SessionState whole(const Entry& e) const;
  // Moves the entry and its chain of parents to the front, parents first.
  void touch(List::iterator it);
  // Lets go of an entry's part; an entry that is not on disk either is erased. Returns the
  // iterator after it.
  List::iterator release(List::iterator it);
  // Writes an entry's session to the disk tier (its part, or `state` when it has none), with
  // the block snapshots above it that are not there yet; adds the files the store removed to
  // `removed`.
  void write(Entry& e, const SessionState* state, std::vector<std::string>& removed);
  void evict();
  static double saved_per_byte(const Entry& e);
  void forget_files(const std::vector<std::string>& files);
  std::optional<size_t> store_index(const Entry& e) const;

  size_t max_entries_;
  uint64_t max_bytes_;
  std::unique_ptr<PrefixStore> store_;
  List entries_;
  TokenTrie<Entry> index_;  // every entry by its key
  size_t ram_entries_ = 0;
  uint64_t bytes_ = 0;
  double clock_ = 0;  // GreedyDual's inflation value: the last victim's priority
};

}  // namespace dsv4::server
