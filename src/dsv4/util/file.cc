#include "dsv4/util/file.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"
#include "dsv4/util/io_faults.h"

namespace dsv4 {
File File::open_read(const std::string& path) {
  const int fd = platform::open_read(path);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  platform::FileInfo info;
  if (!platform::stat_file(fd, &info) || !info.regular) {
    platform::close_file(fd);
    fail("{}: not a regular file", path);
  }
  return File(fd, path);
}

File File::open_direct(const std::string& path) {
  const int fd = platform::open_unbuffered(path);
  if (fd < 0) return File();
  return File(fd, path);
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) platform::close_file(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) platform::close_file(fd_);
}

uint64_t File::size() const {
  platform::FileInfo info;
  if (!platform::stat_file(fd_, &info)) fail("{}: cannot stat: {}", path_, std::strerror(errno));
  return info.size;
}

void File::read_exact(void* dst, uint64_t length, uint64_t offset, IoFaults* faults) const {
  constexpr uint64_t kChunk = 64ull << 20;  // bounded syscalls keep reads interruptible
  auto* out = static_cast<uint8_t*>(dst);
  while (length > 0) {
    size_t want = static_cast<size_t>(std::min(length, kChunk));
    int64_t got = faulty_pread(faults, path_, fd_, out, want, offset);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail("{}: read of {} bytes at offset {} failed: {}", path_, want, offset, std::strerror(errno));
    }
    if (got == 0) fail("{}: unexpected end of file at offset {} (file truncated?)", path_, offset);
    out += got;
    offset += static_cast<uint64_t>(got);
    length -= static_cast<uint64_t>(got);
  }
}

bool read_direct_window(const File& direct, void* dst, uint64_t length, uint64_t offset,
                        uint8_t* bounce, size_t bounce_size, IoFaults* faults) {
  auto* out = static_cast<uint8_t*>(dst);
  while (length > 0) {
    uint64_t aligned_start = offset & ~(uint64_t{kDirectAlign} - 1);
    uint64_t skip = offset - aligned_start;
    uint64_t window = std::min<uint64_t>(bounce_size, (skip + length + kDirectAlign - 1) & ~(uint64_t{kDirectAlign} - 1));
    uint64_t filled = 0;
    while (filled < window) {
      int64_t got = faulty_pread(faults, direct.path(), direct.fd(), bounce + filled, window - filled,
                                 aligned_start + filled);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL) return false;
        fail("{}: direct read at offset {} failed: {}", direct.path(), aligned_start + filled,
             std::strerror(errno));
      }
      if (got == 0) break;  // end of file inside the last aligned block
      filled += static_cast<uint64_t>(got);
    }
    if (filled <= skip) fail("{}: unexpected end of file at offset {}", direct.path(), offset);
    uint64_t take = std::min(length, filled - skip);
    std::memcpy(out, bounce + skip, take);
    out += take;
    offset += take;
    length -= take;
  }
  return true;
}

AlignedBuffer::AlignedBuffer(size_t size, size_t align) : size_(size) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t rounded = (std::max<size_t>(size, 1) + align - 1) / align * align;
  if (rounded >= kHugePage && kHugePage % align == 0) {
    uint8_t* p = platform::allocate_pages(rounded);
    if (!p) fail("out of memory allocating {} bytes", size);
    ptr_ = std::unique_ptr<uint8_t, Free>(p, Free{rounded});
    return;
  }
  void* p = platform::aligned_alloc(align, rounded);
  if (!p) fail("out of memory allocating {} bytes", size);
  ptr_ = std::unique_ptr<uint8_t, Free>(static_cast<uint8_t*>(p), Free{0});
}

void AlignedBuffer::Free::operator()(uint8_t* p) const {
  if (mapped)
    platform::free_pages(p, mapped);
  else
    platform::aligned_free(p);
}

void BulkReader::read(const File& file, void* dst, uint64_t length, uint64_t offset) {
  if (length >= kMinDirectBytes) {
    auto it = direct_.find(file.path());
    if (it == direct_.end()) it = direct_.emplace(file.path(), File::open_direct(file.path())).first;
    if (it->second.valid()) {
      if (bounce_.size() == 0) bounce_ = AlignedBuffer(kBounceBytes);
      if (read_direct_window(it->second, dst, length, offset, bounce_.data(), bounce_.size(), faults_)) return;
      it->second = File();  // the kernel refused this file's direct reads: stay buffered
    }
  }
  file.read_exact(dst, length, offset, faults_);
}

std::string read_small_file(const std::string& path, uint64_t max_bytes) {
  File f = File::open_read(path);
  uint64_t size = f.size();
  if (size > max_bytes) fail("{}: file is {} bytes, more than the {} allowed", path, size, max_bytes);
  std::string text(static_cast<size_t>(size), '\0');
  f.read_exact(text.data(), size, 0);
  return text;
}

bool path_exists(const std::string& path) {
  platform::FileInfo info;
  return platform::stat_path(path, &info);
}

bool is_directory(const std::string& path) {
  platform::FileInfo info;
  return platform::stat_path(path, &info) && info.directory;
}

}  // namespace dsv4
