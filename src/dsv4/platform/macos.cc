// macOS: F_NOCACHE + F_RDADVISE instead of O_DIRECT (reads go through the same pread threads as
// Linux's fallback, so the logic is tested there), sysctl / task_info for memory. Small on
// purpose; everything else is posix.cc.
#include <fcntl.h>
#include <mach-o/dyld.h>
#include <mach/mach.h>
#include <sys/mman.h>
#include <sys/sysctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dsv4/platform/platform.h"
#include "dsv4/platform/read_queue.h"

namespace dsv4 {

std::unique_ptr<ReadQueue> make_native_read_queue(int, ReadQueue::Done, std::shared_ptr<IoFaults>) { return nullptr; }

namespace platform {

// The OS cache is bypassed per descriptor (F_NOCACHE); reads need no alignment, but the
// callers align them anyway. The pread workers announce each read (advise_read, F_RDADVISE).
int open_unbuffered(const std::string& path) {
  const int fd = open_read(path);
  if (fd < 0) return -1;
  if (::fcntl(fd, F_NOCACHE, 1) != 0) {
    ::close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

bool sync_data(int fd) { return ::fcntl(fd, F_FULLFSYNC) == 0 || ::fsync(fd) == 0; }
void drop_cached_pages(int fd) { ::fcntl(fd, F_NOCACHE, 1); }

void advise_read(int fd, uint64_t offset, uint64_t length) {
  radvisory advice{};
  advice.ra_offset = static_cast<off_t>(offset);
  advice.ra_count = static_cast<int>(std::min<uint64_t>(length, 1u << 30));
  ::fcntl(fd, F_RDADVISE, &advice);  // advisory: a failure changes nothing
}

uint8_t* allocate_pages(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

void free_pages(uint8_t* p, size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  if (p) ::munmap(p, rounded);
}

void release_free_memory() {}

namespace {
// This task's resident sizes (zeroed when the kernel does not answer).
mach_task_basic_info task_memory() {
  mach_task_basic_info info{};
  mach_msg_type_number_t count = MACH_TASK_BASIC_INFO_COUNT;
  if (task_info(mach_task_self(), MACH_TASK_BASIC_INFO, reinterpret_cast<task_info_t>(&info), &count) != KERN_SUCCESS)
    return mach_task_basic_info{};
  return info;
}
}  // namespace

uint64_t peak_rss_bytes() { return task_memory().resident_size_max; }
uint64_t current_rss_bytes() { return task_memory().resident_size; }

uint64_t total_memory_bytes() {
  uint64_t bytes = 0;
  size_t len = sizeof bytes;
  return sysctlbyname("hw.memsize", &bytes, &len, nullptr, 0) == 0 ? bytes : 0;
}

uint64_t available_memory_bytes() {
  vm_statistics64_data_t vm;
  mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
  if (host_statistics64(mach_host_self(), HOST_VM_INFO64, reinterpret_cast<host_info64_t>(&vm), &count) != KERN_SUCCESS)
    return 0;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // Free and purgeable pages, and inactive ones (file cache the kernel gives back).
  return (uint64_t(vm.free_count) + vm.inactive_count + vm.purgeable_count) * page;
}

int cpu_count() { return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))); }
const char* os_name() { return "macOS"; }
const char* native_read_queue_name() { return ""; }

std::string executable_path() {
  uint32_t size = 0;
  _NSGetExecutablePath(nullptr, &size);
  std::string path(size, '\0');
  if (_NSGetExecutablePath(path.data(), &size) != 0) return "";
  path.resize(std::strlen(path.c_str()));
  return path;
}

}  // namespace platform
}  // namespace dsv4
