#include "dsv4/experts/shard_files.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "dsv4/io/safetensors.h"
#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"
#include "dsv4/util/io_faults.h"

namespace dsv4 {
ShardFiles::ShardFiles(const std::vector<Source>& shards, bool direct_io, bool quiet) : quiet_(quiet) {
  for (size_t s = 0; s < shards.size(); ++s) {
    const Source& src = shards[s];
    copies_of_.emplace_back();
    std::string reference_header;
    uint64_t reference_size = 0;
    for (size_t k = 0; k < src.copies.size(); ++k) {
      Copy c;
      c.shard = static_cast<int>(s);
      c.folder = src.copies[k].folder;
      c.path = src.copies[k].path;
      c.buffered = File::open_read(c.path);
      platform::FileInfo st;
      if (!platform::stat_file(c.buffered.fd(), &st)) fail("{}: cannot stat: {}", c.path, std::strerror(errno));
      c.size = st.size;
      c.dev = st.device;
      c.ino = st.inode;
      c.mtime_ns = st.mtime_ns;
      c.header = read_raw_header(c.buffered);
      if (k == 0) {
        reference_header = c.header;
        reference_size = c.size;
      } else if (c.size != reference_size) {
        fail("{}: mirror copy is {} bytes but {} is {} bytes; mirrors must be identical copies", c.path, c.size,
             src.copies[0].path, reference_size);
      } else if (c.header != reference_header) {
        fail("{}: mirror copy's header differs from {}'s; mirrors must be identical copies", c.path,
             src.copies[0].path);
      }
      if (direct_io) c.direct = File::open_direct(c.path);
      c.use_direct = c.direct.valid();
      folders_ = std::max(folders_, c.folder + 1);
      copies_of_.back().push_back(static_cast<int>(copies_.size()));
      copies_.push_back(std::move(c));
    }
  }
}

ShardFiles::Fds ShardFiles::fds(int copy) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Copy& c = copies_[copy];
  return {c.use_direct ? c.direct.fd() : c.buffered.fd(), c.buffered.fd(), &c.path};
}

bool ShardFiles::refused(int copy) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !copies_[copy].refused.empty();
}

bool ShardFiles::stop_direct(int copy) {
  std::lock_guard<std::mutex> lock(mutex_);
  Copy& c = copies_[copy];
  if (!c.use_direct) return false;
  c.use_direct = false;
  return true;
}

bool ShardFiles::all_direct() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Copy& c : copies_)
    if (!c.use_direct) return false;
  return true;
}

void ShardFiles::note(Copy& c, const std::string& line) {
  if (quiet_ || c.noted) return;
  c.noted = true;
  std::fprintf(stderr, "dsv4: warning: %s\n", line.c_str());
}

bool ShardFiles::check(Copy& c) {
  platform::FileInfo st;
  if (!platform::stat_path(c.path, &st)) {
    // Gone from the directory. The open file still holds the bytes loaded at start.
    if (!c.deleted) {
      c.deleted = true;
      c.noted = false;
    }
    note(c, fmt::format("{}: deleted from disk; still read through the open file, but a restart will not find it",
                        c.path));
  } else if (st.device != c.dev || st.inode != c.ino) {
    // Another file now has this name: take it once it is the same shard.
    c.deleted = false;
    std::string problem;
    try {
      File fresh = File::open_read(c.path);
      platform::FileInfo fs;
      if (!platform::stat_file(fresh.fd(), &fs)) fail("{}: cannot stat: {}", c.path, std::strerror(errno));
      if (fs.size != c.size) {
        problem = fmt::format("{}: replaced by a file of {} bytes, but the shard loaded at start has {}; refused",
                              c.path, fs.size, c.size);
      } else if (read_raw_header(fresh) != c.header) {
        problem = fmt::format("{}: replaced by a file whose header differs from the shard loaded at start; refused",
                              c.path);
      } else {
        File direct = c.direct.valid() ? File::open_direct(c.path) : File();
        retired_.push_back(std::move(c.buffered));
        if (c.direct.valid()) retired_.push_back(std::move(c.direct));
        c.buffered = std::move(fresh);
        c.direct = std::move(direct);
        c.use_direct = c.direct.valid();
        c.dev = fs.device;
        c.ino = fs.inode;
        c.mtime_ns = fs.mtime_ns;
        const bool was_refused = !c.refused.empty();
        c.refused.clear();
        c.noted = false;
        if (!quiet_)
          std::fprintf(stderr, "dsv4: note: %s was replaced on disk by an identical shard; reopened%s\n",
                       c.path.c_str(), was_refused ? " (reads from it work again)" : "");
        return true;
      }
    } catch (const Error& e) {
      problem = fmt::format("{}; refused", e.what());
    }
    if (c.refused != problem) c.noted = false;
    c.refused = problem;
    note(c, c.refused);
    return false;
  } else {
    c.deleted = false;
  }
  // The file we hold: its size and (when it was written to) its header must still match.
  platform::FileInfo fs;
  std::string problem;
  if (!platform::stat_file(c.buffered.fd(), &fs)) {
    problem = fmt::format("{}: cannot stat the open shard: {}", c.path, std::strerror(errno));
  } else if (fs.size != c.size) {
    problem = fmt::format("{}: the shard changed size under the engine ({} bytes at start, now {}); refused", c.path,
                          c.size, fs.size);
  } else if (fs.mtime_ns != c.mtime_ns) {
    try {
      if (read_raw_header(c.buffered) == c.header) {
        c.mtime_ns = fs.mtime_ns;  // written to, but still the same layout
      } else {
        problem = fmt::format("{}: the shard's header changed under the engine; refused", c.path);
      }
    } catch (const Error& e) {
      problem = fmt::format("{}; refused", e.what());
    }
  }
  if (problem != c.refused) c.noted = false;
  c.refused = problem;
  if (!problem.empty()) note(c, problem);
  return false;
}

ShardFiles::Verdict ShardFiles::after_read(int copy, int fd, bool failed, std::string* why) {
  std::lock_guard<std::mutex> lock(mutex_);
  Copy& c = copies_[copy];
  if (fd != c.buffered.fd() && fd != c.direct.fd()) return Verdict::kRetry;  // reopened meanwhile
  bool suspicious = failed || !c.refused.empty();
  if (!suspicious) {
    platform::FileInfo fs;
    suspicious = !platform::stat_file(c.buffered.fd(), &fs) || fs.size != c.size || fs.mtime_ns != c.mtime_ns;
  }
  if (!suspicious) return Verdict::kOk;
  if (check(c)) return Verdict::kRetry;
  if (!c.refused.empty()) {
    *why = c.refused;
    return Verdict::kRefused;
  }
  // The file checks out: a failed read's own error stands; a read that only looked
  // suspicious (the contents were rewritten with the same header) is read again.
  return failed ? Verdict::kOk : Verdict::kRetry;
}

std::vector<std::string> ShardFiles::check_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  last_check_ = IoFaults::now();
  std::vector<std::string> problems;
  for (Copy& c : copies_) {
    check(c);
    if (!c.refused.empty()) {
      problems.push_back(c.refused);
    } else if (c.deleted) {
      problems.push_back(fmt::format("{}: deleted from disk (still read through the open file)", c.path));
    }
  }
  return problems;
}

void ShardFiles::check_now_and_then(double now, double interval_s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (now - last_check_ < interval_s) return;
    last_check_ = now;  // claimed: concurrent callers return
  }
  check_all();
}

}  // namespace dsv4
