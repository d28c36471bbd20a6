// Every operating-system call dsv4 makes, behind one interface (LevelDB's Env, SQLite's VFS):
// files and unbuffered reads, page allocation, memory and CPU facts, the console, Ctrl-C and
// processes. One implementation per OS beside this header (posix.cc with linux.cc or macos.cc;
// windows.cc), chosen by the build; nothing outside this folder includes an OS header.
//
// Files are int descriptors on every OS: on Windows a C runtime descriptor over the HANDLE
// (_open_osfhandle), so the code above this layer is the same everywhere. Calls that fail
// return -1 (or false) and set errno; Windows error codes are mapped to the nearest errno, so
// callers keep one error path (EINTR: retry; EINVAL on an unbuffered read: the filesystem
// refused it, read buffered).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace dsv4::platform {

// ---- Files ---------------------------------------------------------------------------------

// Buffer, offset and length alignment of unbuffered reads (O_DIRECT, FILE_FLAG_NO_BUFFERING).
inline constexpr size_t kDirectAlign = 4096;

// Read-only, shared with writers and with renames over the path (a mirror restored by `mv`).
int open_read(const std::string& path);
// Read-only, bypassing the OS cache: O_DIRECT (Linux), F_NOCACHE (macOS), NO_BUFFERING |
// OVERLAPPED (Windows). -1 when the filesystem refuses; callers then read buffered.
int open_unbuffered(const std::string& path);
// Write-only, created (mode 0644) and truncated; `exclusive`: fails with EEXIST if present.
int create_for_write(const std::string& path, bool exclusive);
int close_file(int fd);

struct FileInfo {
  bool regular = false;
  bool directory = false;
  uint64_t size = 0;
  uint64_t device = 0, inode = 0;  // identity: another file at the same path differs here
  int64_t mtime_ns = 0;            // last modification, nanoseconds since the epoch
};
bool stat_file(int fd, FileInfo* info);
bool stat_path(const std::string& path, FileInfo* info);

// pread(2)/pwrite(2): bytes moved, 0 at end of file, -1 with errno. Never moves a file offset,
// safe from many threads on one descriptor.
int64_t pread(int fd, void* dst, size_t length, uint64_t offset);
// One destination of a vectored read.
struct IoSpan {
  uint8_t* dst = nullptr;
  uint64_t length = 0;
};
inline constexpr int kMaxIoSpans = 64;  // spans one vectored read may have (IOV_MAX is >= 1024)
// preadv(2): bytes [offset, offset + total) into the spans in order, as one request (Linux,
// macOS); Windows reads span after span and stops at the first short one. Returns what pread
// returns.
int64_t preadv(int fd, const IoSpan* spans, int count, uint64_t offset);
int64_t pwrite(int fd, const void* src, size_t length, uint64_t offset);
// write(2) at the file's own offset (files from create_for_write).
int64_t write(int fd, const void* src, size_t length);
// Writes the file's data to the device.
bool sync_data(int fd);
// Advisory: the written pages may leave the OS cache (after sync_data).
void drop_cached_pages(int fd);
// Advisory: [offset, offset + length) is about to be read by the pread workers (macOS
// F_RDADVISE, which starts the read-ahead an F_NOCACHE descriptor otherwise lacks; a no-op
// where the queue's reads need no hint).
void advise_read(int fd, uint64_t offset, uint64_t length);
// rename(2): replaces `to` if it exists (Windows: MoveFileEx with REPLACE_EXISTING).
bool rename_replace(const std::string& from, const std::string& to);
bool remove_file(const std::string& path);
// Creates the directory (not its parents); true if it exists afterwards.
bool make_directory(const std::string& path);
// Whether this process may list, create and remove files in `dir`.
bool can_write_directory(const std::string& dir);
// Sets a file's modification time to now.
void touch_file(const std::string& path);
// Makes a rename inside `dir` durable (fsync of the directory; a no-op where the OS has none).
void sync_directory(const std::string& dir);

// std::fopen with a UTF-8 path on every OS (Windows: _wfopen).
std::FILE* fopen_utf8(const std::string& path, const char* mode);
// std::filesystem paths from and to UTF-8 text (on Windows a path is wide, and its narrow
// constructor would read the ANSI code page).
std::filesystem::path fs_path(const std::string& utf8);
std::string utf8_path(const std::filesystem::path& path);

// ---- Memory and CPU -----------------------------------------------------------------------

// Zeroed pages for big buffers (weights, caches, workspaces): 2 MiB aligned with transparent
// huge pages on Linux, large pages on Windows when the process holds SeLockMemoryPrivilege.
// Null when out of memory. Free with free_pages(p, bytes) (the same bytes).
uint8_t* allocate_pages(size_t bytes);
void free_pages(uint8_t* p, size_t bytes);
// Aligned heap memory for small buffers (std::aligned_alloc is missing on Windows).
void* aligned_alloc(size_t align, size_t bytes);
void aligned_free(void* p);
// Returns the allocator's free memory to the OS (glibc's malloc_trim; a no-op elsewhere).
void release_free_memory();

uint64_t peak_rss_bytes();     // 0 if unknown
uint64_t current_rss_bytes();  // 0 if unknown
// What the machine can still give this process (MemAvailable capped by a cgroup limit on
// Linux; available physical memory elsewhere). 0 if unknown.
uint64_t available_memory_bytes();
uint64_t total_memory_bytes();
// The 1, 5 and 15 minute load averages; false where the OS has none (Windows).
bool load_average(double out[3]);
// The process's environment, NAME=VALUE strings ending with a null.
char** environment();
// CPUs this process may run on (its affinity mask), at least 1.
int cpu_count();
// "Linux", "Windows", "macOS", for `dsv4 settings`.
const char* os_name();
// The read queue the OS does best ("io_uring", "IOCP"), or "" where only pread threads exist.
const char* native_read_queue_name();

// ---- Console, processes, Ctrl-C -----------------------------------------------------------

// Call first in main: UTF-8 console output on Windows; no-op elsewhere.
void init_console();
// The program's arguments as UTF-8 (Windows: from the wide command line).
std::vector<std::string> utf8_arguments(int argc, char** argv);
bool is_terminal(int fd);  // 0 stdin, 1 stdout, 2 stderr
bool is_terminal(std::FILE* f);
// One read from stdin: bytes read, 0 at end, -1 with errno (EINTR when Ctrl-C interrupted it).
int64_t read_stdin(void* dst, size_t length);
// Writes all of it to stderr/stdout descriptors unbuffered (safe from an interrupt handler).
void write_fd(int fd, const char* text, size_t length);

int process_id();
bool process_alive(int pid);
// Absolute path of the running executable ("" if unknown).
std::string executable_path();
[[noreturn]] void exit_now(int code);
// Runs `command` in the system shell; its stdout (and whatever it redirects there) into
// `output` when given. The exit code; 128 + N when a signal N ended it; -1 if it did not start.
int run_shell(const std::string& command, std::string* output = nullptr);  // _exit: no destructors, no atexit
// Runs `command_line` (a program and its arguments, double quotes group as in both OSes'
// shells; no pipes or variables) with stdin, stdout and stderr from and to the named files,
// killed after `timeout_s` seconds. The exit code; 124 on the timeout (as timeout(1) says);
// 128 + N when a signal N ended it; -1 if it did not start.
int run_program(const std::string& command_line, const std::string& stdin_path, const std::string& stdout_path,
                const std::string& stderr_path, int timeout_s);
// A client that hangs up must not kill the process (SIGPIPE).
void ignore_broken_pipe();

// Ctrl-C for run and chat: `handler` runs on each press, in a signal handler on POSIX (only
// lock-free atomics, write_fd and exit_now there) or on the console's control thread on Windows.
// A blocked read_stdin returns -1 with EINTR.
void on_interrupt(void (*handler)());

// Ctrl-C and termination for serve: signals are taken on a thread of this object's own, which
// may run ordinary code; `on_signal(interrupt)` (interrupt: Ctrl-C; false: SIGTERM, console
// close). Construct before any other thread starts (POSIX blocks the signals in every thread
// created afterwards).
class SignalThread {
 public:
  explicit SignalThread(std::function<void(bool interrupt)> on_signal);
  ~SignalThread();
  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;
  struct State;

 private:
  State* state_;
};

}  // namespace dsv4::platform
