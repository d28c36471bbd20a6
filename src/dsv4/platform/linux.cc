// Linux: O_DIRECT, transparent huge pages, /proc and cgroup memory facts, CPU affinity.
#include <fcntl.h>
#include <malloc.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dsv4/platform/platform.h"

namespace dsv4::platform {
namespace {

// Value of a "Key:   1234 kB" line, in bytes.
uint64_t read_kb_field(const char* path, const char* key) {
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char line[256];
  uint64_t value = 0;
  const size_t key_len = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, key_len) == 0 && line[key_len] == ':') {
      unsigned long long kb = 0;
      if (std::sscanf(line + key_len + 1, "%llu", &kb) == 1) value = kb * 1024;
      break;
    }
  }
  std::fclose(f);
  return value;
}

uint64_t cgroup_limit_bytes() {
  FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r");
  if (!f) return 0;
  unsigned long long limit = 0;
  const bool numeric = std::fscanf(f, "%llu", &limit) == 1;  // "max" means no limit
  std::fclose(f);
  return numeric ? limit : 0;
}

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

int open_unbuffered(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

bool sync_data(int fd) { return ::fdatasync(fd) == 0; }
void drop_cached_pages(int fd) { ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }
void advise_read(int, uint64_t, uint64_t) {}  // O_DIRECT reads go straight to the device

// Maps one huge page more than needed and keeps the 2 MiB-aligned part. The mapping is not
// rounded up to whole huge pages, so the tail stays in 4 KiB pages and RSS is unchanged.
uint8_t* allocate_pages(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  const size_t span = rounded + kHugePage;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = (base + kHugePage - 1) / kHugePage * kHugePage;
  const size_t head = start - base, tail = span - head - rounded;
  if (head) ::munmap(p, head);
  if (tail) ::munmap(reinterpret_cast<void*>(start + rounded), tail);
  ::madvise(reinterpret_cast<void*>(start), rounded, MADV_HUGEPAGE);  // advisory: ignore failure
  return reinterpret_cast<uint8_t*>(start);
}

void free_pages(uint8_t* p, size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  if (p) ::munmap(p, rounded);
}

uint64_t peak_rss_bytes() { return read_kb_field("/proc/self/status", "VmHWM"); }
uint64_t current_rss_bytes() { return read_kb_field("/proc/self/status", "VmRSS"); }
uint64_t total_memory_bytes() { return read_kb_field("/proc/meminfo", "MemTotal"); }

uint64_t available_memory_bytes() {
  uint64_t available = read_kb_field("/proc/meminfo", "MemAvailable");
  const uint64_t limit = cgroup_limit_bytes();
  if (limit > 0) {
    const uint64_t used = current_rss_bytes();
    const uint64_t room = limit > used ? limit - used : 0;
    if (available == 0 || room < available) available = room;
  }
  return available;
}

int cpu_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

void release_free_memory() { malloc_trim(0); }

const char* os_name() { return "Linux"; }
const char* native_read_queue_name() { return "io_uring"; }

std::string executable_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace dsv4::platform
