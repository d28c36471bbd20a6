// RAII file descriptors and the two ways dsv4 reads bytes: buffered pread (EINTR-safe, in
// chunks) and O_DIRECT into 4 KiB-aligned buffers (what the expert cache uses).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dsv4/platform/platform.h"

namespace dsv4 {

class IoFaults;

inline constexpr size_t kDirectAlign = platform::kDirectAlign;

class File {
 public:
  File() = default;
  // Opens read-only; throws Error naming the path on failure.
  static File open_read(const std::string& path);
  // Opens read-only with O_DIRECT; returns an invalid File (valid() == false) if the
  // filesystem refuses O_DIRECT, so callers can fall back to buffered reads.
  static File open_direct(const std::string& path);

  File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size() const;

  // Reads exactly `length` bytes at `offset`; throws Error (naming the path) on a short
  // read or an I/O error. Retries on EINTR and splits large reads into chunks. `faults`:
  // the test fault layer (util/io_faults.h), consulted before each syscall.
  void read_exact(void* dst, uint64_t length, uint64_t offset, IoFaults* faults = nullptr) const;

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// Reads [offset, offset+length) of a file through an O_DIRECT descriptor into `dst`.
// O_DIRECT needs the file offset, length and buffer aligned; this reads the enclosing
// aligned window into `bounce` (capacity `bounce_size`, 4 KiB aligned) and copies out.
// Returns false if the direct read failed with EINVAL (caller falls back to buffered).
bool read_direct_window(const File& direct, void* dst, uint64_t length, uint64_t offset,
                        uint8_t* bounce, size_t bounce_size, IoFaults* faults = nullptr);

// Aligned heap buffer (4 KiB by default) with RAII, for O_DIRECT targets and weights.
// Buffers of 2 MiB and more start on a 2 MiB boundary and ask for transparent huge pages:
// the kernels stream through whole weight matrices, and with 4 KiB pages every 4 KiB costs a
// TLB miss whose page walk itself misses the caches once the weights span gigabytes.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size, size_t align = kDirectAlign);
  AlignedBuffer(AlignedBuffer&&) noexcept = default;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept = default;
  uint8_t* data() { return ptr_.get(); }
  const uint8_t* data() const { return ptr_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    size_t mapped;  // bytes from platform::allocate_pages, 0: from platform::aligned_alloc
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> ptr_{nullptr, Free{0}};
  size_t size_ = 0;
};

// Reads large byte ranges (whole weight tensors) with O_DIRECT through one bounce buffer in
// huge pages, falling back to buffered pread where the filesystem refuses O_DIRECT. Buffered
// reads of a cold checkpoint run at a fraction of the SSD's speed here (the page-cache copy
// keeps a core busy in the kernel) and leave a second copy of the weights in the page cache.
// Small ranges stay buffered: an aligned 4 KiB window would cost more than it saves.
class BulkReader {
 public:
  // `faults`: the test fault layer, consulted before each read (null: none).
  explicit BulkReader(IoFaults* faults = nullptr) : faults_(faults) {}
  // Reads exactly `length` bytes at `offset` of `file` into `dst` (any alignment); throws
  // Error naming the path on a short read or an I/O error.
  void read(const File& file, void* dst, uint64_t length, uint64_t offset);

 private:
  static constexpr uint64_t kMinDirectBytes = 256 << 10;
  static constexpr size_t kBounceBytes = 16 << 20;
  IoFaults* faults_ = nullptr;
  std::map<std::string, File, std::less<>> direct_;  // by path; invalid: O_DIRECT refused
  AlignedBuffer bounce_;
};

// Reads a whole (small) file into a string; throws Error if larger than max_bytes.
std::string read_small_file(const std::string& path, uint64_t max_bytes);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace dsv4
