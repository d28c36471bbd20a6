// The files the expert store reads: every shard of the checkpoint in each folder that holds
// a copy of it (folder 0 is the checkpoint's own, then the mirrors in order), each watched
// while the engine runs:
//  - a copy whose size, or whose header after its modification time changed, is refused:
//    reads from it fail (and go to another copy when there is one) until it matches again;
//  - a path that now names another file (a shard restored by copying it next to the old one
//    and `mv`-ing it over) is reopened once that file's size and header equal the ones
//    loaded at start; until then the copy is refused;
//  - a deleted path is reported (the open file still reads; it would be gone at restart).
// Every copy's size and header are checked against the checkpoint's at start.
//
// Thread safety: one internal mutex; syscalls run under it, but only in checks, which are
// rare (after a failed or suspicious read, from health(), and at most once a second).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dsv4/util/file.h"

namespace dsv4 {

class ShardFiles {
 public:
  // One shard's copies: the checkpoint's own first (its header is the reference), then
  // the same file in other folders. Folder 0 is the checkpoint directory, 1.. the mirrors.
  struct Source {
    struct Copy {
      int folder = 0;
      std::string path;
    };
    std::vector<Copy> copies;
  };
  // Opens every copy; throws Error naming the file when a copy's size or header differs
  // from the checkpoint's. `direct_io`: also open with O_DIRECT where the filesystem allows.
  // `quiet`: no note on stderr when a copy goes bad, is reopened or deleted.
  ShardFiles(const std::vector<Source>& shards, bool direct_io, bool quiet = false);

  int shard_count() const { return static_cast<int>(copies_of_.size()); }
  // Copy ids of shard s (the checkpoint's own first).
  const std::vector<int>& copies_of(int shard) const { return copies_of_[shard]; }
  int folder_of(int copy) const { return copies_[copy].folder; }
  int folder_count() const { return folders_; }

  struct Fds {
    int read_fd;      // O_DIRECT when allowed
    int buffered_fd;  // fallback
    const std::string* path;
  };
  Fds fds(int copy) const;
  // Whether reads from this copy are refused right now (as of the last check).
  bool refused(int copy) const;
  // The kernel refused a direct read of this copy: read it buffered from now on. Returns
  // true the first time (so the caller can say so once).
  bool stop_direct(int copy);
  bool all_direct() const;

  enum class Verdict : uint8_t { kOk, kRetry, kRefused };
  // After a read from `copy` through `fd` finished (`failed`: with an error): whether the
  // bytes can be used. kRetry: the copy was reopened since (or just now); read it again.
  // kRefused: `why` says what is wrong with the copy. A failed read of a file that looks
  // intact is kOk: the read's own error stands.
  Verdict after_read(int copy, int fd, bool failed, std::string* why);

  // Re-checks every copy now (stat: replaced, deleted, resized) and returns one line per
  // problem (refused or deleted copies); empty when all is well.
  std::vector<std::string> check_all();
  // check_all() at most once per `interval_s` (cheap to call after every read).
  void check_now_and_then(double now, double interval_s = 1.0);

 private:
  struct Copy {
    int shard = 0, folder = 0;
    std::string path;
    File buffered, direct;
    bool use_direct = false;
    uint64_t size = 0;
    std::string header;  // the first 8 + header length bytes, as loaded at start
    uint64_t dev = 0, ino = 0;  // platform::FileInfo identity
    int64_t mtime_ns = 0;       // of the validated contents
    std::string refused;       // non-empty: reads are refused, and why
    bool deleted = false;
    bool noted = false;        // the current problem was printed on stderr
  };
  // Re-validates one copy (mutex held); returns true if it was reopened.
  bool check(Copy& c);
  void note(Copy& c, const std::string& line);

  mutable std::mutex mutex_;
  std::vector<Copy> copies_;
  std::vector<std::vector<int>> copies_of_;
  std::vector<File> retired_;  // replaced files: reads in flight may still use their fds
  int folders_ = 1;
  bool quiet_ = false;
  double last_check_ = 0;
};

}  // namespace dsv4
