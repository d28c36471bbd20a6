// The prefix cache's disk tier (dsv4 serve --cache-dir): session snapshots that survive a
// restart, so an agent's long system prompt and tool list are not prefilled again.
//
// One file per snapshot, "<identity>-<key hash>.dsv4p": a header (magic, checksum, identity,
// sizes, parent, flags), the key's tokens, the text they decode to, then the session
// (session_io). Entries are deduplicated by block: a snapshot whose tokens extend a stored
// block snapshot (its parent, named by the parent's key length: a prefix of this key) holds
// only the compressed caches' rows past the parent's, and the parent is never removed while
// an entry refers to it; the prefix cache joins a chain back into a session. The
// identity names the checkpoint (config, index, each shard's name, size, mtime and first and
// last 64 KiB), the numerics and the dsv4 executable itself (a rebuilt engine never reuses a
// state an older one computed); entries of another identity are left alone. The checksum
// (XXH3-64) covers everything after it and is checked on every load: a corrupted or truncated
// entry is reported in one warning, removed, and the prompt is prefilled as if it had never
// been cached. Writes go to a temporary file that is fsynced and renamed into place, so a
// crash or kill -9 never leaves a partial entry under a real name (temporary files of dead
// processes are removed at start). The entries of this identity are kept within a byte bound,
// least recently used (file mtime, refreshed on each hit) removed first.
//
// The directory must be as trusted as the checkpoint: entries are checked for corruption, not
// for forgery. Not thread-safe: the scheduler's worker is its only user.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dsv4/model/engine.h"
#include "dsv4/model/session.h"

namespace dsv4::server {

using StoreIdentity = std::array<uint8_t, 16>;

// The identity of sessions computed by `engine` with this dsv4 build.
StoreIdentity store_identity(const Engine& engine);

// An entry as the index knows it (its header), without its session.
struct StoredPrefix {
  std::vector<int32_t> key;  // the session's tokens + the tail
  size_t state_tokens = 0;   // the session's own tokens (a prefix of key)
  std::string text;          // what the key decodes to
  std::string file;          // name inside the directory
  uint64_t bytes = 0;        // file size
  int64_t mtime_ns = 0;
  // The block snapshot whose rows this entry's session leaves out ("" if it is whole): the
  // entry of key.first(parent_tokens).
  std::string parent_file;
  size_t parent_tokens = 0;
  bool block = false;  // a block snapshot (others may refer to it)
  bool own = false;    // a request's own snapshot
  size_t children = 0;  // entries in the index whose parent this is
};

// What kind of snapshot an entry is, and the block snapshot it extends.
struct StoreLinks {
  std::string parent_file;  // "" : the session is whole
  bool block = false, own = true;
};

struct StoreLimits {
  int64_t layers = 0;      // a session must have this many layers
  int64_t vocab_size = 0;  // and only tokens below this
  // The MTP drafter's state must have the engine's sizes (0 without the drafter): an entry
  // written by a server without it is refused by one with it, and the other way round.
  size_t mtp_streams = 0, mtp_positions = 0;
};

class PrefixStore {
 public:
  using Warn = std::function<void(const std::string&)>;
  // Opens `dir` (created if missing; throws Error naming it when that fails) and reads the
  // headers of its entries; removes corrupted ones of this identity (one warning each),
  // temporary files of dead processes, and the oldest entries beyond `max_bytes`.
  PrefixStore(std::string dir, uint64_t max_bytes, StoreIdentity identity, StoreLimits limits, Warn warn);

  // Entries of this identity, most recently used first.
  const std::vector<StoredPrefix>& entries() const { return entries_; }
  uint64_t bytes() const { return bytes_; }
  const std::string& dir() const { return dir_; }

  // The session of entries()[i], checked (checksum, identity, key, limits); marks it used. On
  // any problem the entry is dropped from the index (a corrupted file is removed, with one
  // warning; a file another process removed meanwhile is forgotten silently). An entry with
  // a parent comes back with the parent's rows left out.
  std::optional<SessionState> load(size_t i);

  // The index of the entry stored in `file`, if any.
  std::optional<size_t> find(const std::string& file) const;

  // Removes entries()[i] and its file, with one warning saying `why`.
  void remove(size_t i, const std::string& why);

  // Marks entries()[i] used (it moves to the front).
  void touch(size_t i);

  // Writes a snapshot keyed by state.tokens + tail (atomically; an existing entry with that
  // key is only marked used). With links.parent_file, `state` holds only the compressed
  // caches' rows past that entry's (which must be a block snapshot in the index whose key is
  // a prefix of state.tokens; else nothing is stored). A failed write (disk full, ...) costs
  // one warning and nothing else: `file` is then empty.
  struct Stored {
    std::string file;                  // the entry's name, "" if not stored
    std::vector<std::string> removed;  // entries removed to stay within the bound
  };
  Stored store(const SessionState& state, std::span<const int32_t> tail, const std::string& text,
               const StoreLinks& links = {});

 private:
  void scan();
  void drop(size_t i, bool remove_file);
  void move_to_front(size_t i);
  std::vector<std::string> evict(const std::string& keep);
  std::string file_name(std::span<const int32_t> key) const;

  std::string dir_;
  uint64_t max_bytes_;
  StoreIdentity identity_;
  std::string identity_hex_;
  StoreLimits limits_;
  Warn warn_;
  std::vector<StoredPrefix> entries_;
  uint64_t bytes_ = 0;
  uint64_t temp_counter_ = 0;
};

}  // namespace dsv4::server
