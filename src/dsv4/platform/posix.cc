// What Linux and macOS share: descriptors, pread/pwrite, signals, the console, processes.
// The OS-specific rest is in linux.cc and macos.cc.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "dsv4/platform/platform.h"

extern char** environ;  // POSIX: the process environment

namespace dsv4::platform {

int open_read(const std::string& path) {
  int fd;
  // O_NONBLOCK: a FIFO (or a device) at the path must not block the open; callers refuse it
  // by its type before any read, and regular files get their blocking mode back.
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

int create_for_write(const std::string& path, bool exclusive) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (exclusive ? O_EXCL : 0), 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

int close_file(int fd) { return ::close(fd); }

namespace {
void fill_info(const struct stat& st, FileInfo* info) {
  info->regular = S_ISREG(st.st_mode);
  info->directory = S_ISDIR(st.st_mode);
  info->size = static_cast<uint64_t>(st.st_size);
  info->device = static_cast<uint64_t>(st.st_dev);
  info->inode = static_cast<uint64_t>(st.st_ino);
#if defined(__APPLE__)
  info->mtime_ns = int64_t(st.st_mtimespec.tv_sec) * 1'000'000'000 + st.st_mtimespec.tv_nsec;
#else
  info->mtime_ns = int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
#endif
}
}  // namespace

bool stat_file(int fd, FileInfo* info) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  fill_info(st, info);
  return true;
}

bool stat_path(const std::string& path, FileInfo* info) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  fill_info(st, info);
  return true;
}

int64_t pread(int fd, void* dst, size_t length, uint64_t offset) {
  return ::pread(fd, dst, length, static_cast<off_t>(offset));
}

int64_t preadv(int fd, const IoSpan* spans, int count, uint64_t offset) {
  iovec iov[kMaxIoSpans];
  const int n = std::min(count, kMaxIoSpans);
  for (int i = 0; i < n; ++i) iov[i] = {spans[i].dst, static_cast<size_t>(spans[i].length)};
  return ::preadv(fd, iov, n, static_cast<off_t>(offset));
}

int64_t pwrite(int fd, const void* src, size_t length, uint64_t offset) {
  return ::pwrite(fd, src, length, static_cast<off_t>(offset));
}

bool rename_replace(const std::string& from, const std::string& to) { return ::rename(from.c_str(), to.c_str()) == 0; }
bool remove_file(const std::string& path) { return ::unlink(path.c_str()) == 0; }
bool make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return true;
  if (errno != EEXIST) return false;
  FileInfo info;
  return stat_path(path, &info) && info.directory;
}
bool can_write_directory(const std::string& dir) { return ::access(dir.c_str(), R_OK | W_OK | X_OK) == 0; }
void touch_file(const std::string& path) { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

int64_t write(int fd, const void* src, size_t length) { return ::write(fd, src, length); }

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::FILE* fopen_utf8(const std::string& path, const char* mode) { return std::fopen(path.c_str(), mode); }
std::filesystem::path fs_path(const std::string& utf8) { return std::filesystem::path(utf8); }
std::string utf8_path(const std::filesystem::path& path) { return path.string(); }

void* aligned_alloc(size_t align, size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  return std::aligned_alloc(align, rounded);
}
void aligned_free(void* p) { std::free(p); }

bool load_average(double out[3]) { return ::getloadavg(out, 3) == 3; }
char** environment() { return environ; }

void init_console() {}

std::vector<std::string> utf8_arguments(int argc, char** argv) { return std::vector<std::string>(argv, argv + argc); }

bool is_terminal(int fd) { return ::isatty(fd) != 0; }
bool is_terminal(std::FILE* f) { return ::isatty(::fileno(f)) != 0; }

int64_t read_stdin(void* dst, size_t length) { return ::read(0, dst, length); }

void write_fd(int fd, const char* text, size_t length) {
  while (length > 0) {
    const ssize_t n = ::write(fd, text, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    length -= static_cast<size_t>(n);
  }
}

int process_id() { return static_cast<int>(::getpid()); }
bool process_alive(int pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }
void exit_now(int code) { ::_exit(code); }

int run_shell(const std::string& command, std::string* output) {
  int status;
  if (output) {
    FILE* f = ::popen(command.c_str(), "r");
    if (!f) return -1;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) output->append(buf, n);
    status = ::pclose(f);
  } else {
    status = std::system(command.c_str());
  }
  if (status < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
int run_program(const std::string& command_line, const std::string& stdin_path, const std::string& stdout_path,
                const std::string& stderr_path, int timeout_s) {
  auto quoted = [](const std::string& path) {
    std::string q = "'";
    for (char c : path) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  return run_shell("timeout " + std::to_string(timeout_s) + " " + command_line + " <" + quoted(stdin_path) + " >" +
                   quoted(stdout_path) + " 2>" + quoted(stderr_path));
}

void ignore_broken_pipe() { ::signal(SIGPIPE, SIG_IGN); }

namespace {
void (*g_interrupt_handler)() = nullptr;  // set once, before the signal can arrive
void on_sigint(int) {
  if (g_interrupt_handler) g_interrupt_handler();
}
}  // namespace

void on_interrupt(void (*handler)()) {
  g_interrupt_handler = handler;
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns EINTR
  sigaction(SIGINT, &sa, nullptr);
}

// SIGINT and SIGTERM are blocked in every thread (the mask is inherited by threads created
// later) and taken by sigtimedwait on this thread, which then runs ordinary code instead of a
// handler that may only touch atomics. macOS has no sigtimedwait: sigwait, woken at the end
// by a signal of our own to this thread.
struct SignalThread::State {
  sigset_t set;
  std::atomic<bool> done{false};
  std::function<void(bool)> on_signal;
  std::thread thread;
};

SignalThread::SignalThread(std::function<void(bool interrupt)> on_signal) : state_(new State) {
  State* s = state_;
  s->on_signal = std::move(on_signal);
  sigemptyset(&s->set);
  sigaddset(&s->set, SIGINT);
  sigaddset(&s->set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &s->set, nullptr);
  s->thread = std::thread([s] {
    while (!s->done) {
#if defined(__APPLE__)
      int sig = 0;
      if (sigwait(&s->set, &sig) != 0) continue;
      if (s->done) return;
#else
      const timespec tick{0, 100'000'000};
      const int sig = sigtimedwait(&s->set, nullptr, &tick);
      if (sig < 0) continue;
#endif
      s->on_signal(sig == SIGINT);
    }
  });
}

SignalThread::~SignalThread() {
  state_->done = true;
#if defined(__APPLE__)
  pthread_kill(state_->thread.native_handle(), SIGTERM);
#endif
  state_->thread.join();
  delete state_;
}

}  // namespace dsv4::platform
