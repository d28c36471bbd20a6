// Windows (x86-64, MinGW-w64 or MSVC): wide-character paths (UTF-8 inside, \\?\ for long
// ones), CreateFileW with FILE_FLAG_NO_BUFFERING for unbuffered reads, VirtualAlloc with large
// pages when the privilege is held, GlobalMemoryStatusEx / GetProcessMemoryInfo, a UTF-8
// console and SetConsoleCtrlHandler for Ctrl-C. Descriptors are C runtime ones over the
// HANDLEs (_open_osfhandle), and reads and writes go to the HANDLE with an explicit offset.
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
// After windows.h:
#include <fcntl.h>
#include <io.h>
#include <psapi.h>
#include <shellapi.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "dsv4/platform/platform.h"
#include "dsv4/platform/windows_util.h"

namespace dsv4::platform {

// ---- Text and errors -------------------------------------------------------------------------

std::wstring widen(const std::string& utf8) {
  if (utf8.empty()) return std::wstring();
  const int n = MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), nullptr, 0);
  std::wstring out(static_cast<size_t>(n), L'\0');
  MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), out.data(), n);
  return out;
}

std::string narrow(const std::wstring& wide) {
  if (wide.empty()) return std::string();
  const int n = WideCharToMultiByte(CP_UTF8, 0, wide.data(), static_cast<int>(wide.size()), nullptr, 0, nullptr, nullptr);
  std::string out(static_cast<size_t>(n), '\0');
  WideCharToMultiByte(CP_UTF8, 0, wide.data(), static_cast<int>(wide.size()), out.data(), n, nullptr, nullptr);
  return out;
}

// A path for the wide file APIs: backslashes, and the \\?\ prefix once the absolute path is
// longer than MAX_PATH allows (a deep model folder), which also lifts the 260-character limit.
std::wstring native_path(const std::string& utf8) {
  std::wstring w = widen(utf8);
  std::replace(w.begin(), w.end(), L'/', L'\\');
  if (w.size() < 200 || w.rfind(L"\\\\", 0) == 0) return w;
  const DWORD n = GetFullPathNameW(w.c_str(), 0, nullptr, nullptr);
  if (n == 0) return w;
  std::wstring full(n, L'\0');
  const DWORD got = GetFullPathNameW(w.c_str(), n, full.data(), nullptr);
  full.resize(got);
  return L"\\\\?\\" + full;
}

int errno_from(DWORD error) {
  switch (error) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_NAME:
    case ERROR_BAD_NETPATH:
      return ENOENT;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_LOCK_VIOLATION:
      return EACCES;
    case ERROR_FILE_EXISTS:
    case ERROR_ALREADY_EXISTS:
      return EEXIST;
    case ERROR_INVALID_PARAMETER:  // an unbuffered read that is not sector-aligned
      return EINVAL;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
      return ENOMEM;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
      return ENOSPC;
    case ERROR_OPERATION_ABORTED:
      return EINTR;
    case ERROR_DIRECTORY:
      return ENOTDIR;
    case ERROR_BROKEN_PIPE:
    case ERROR_NO_DATA:
      return EPIPE;
    default:
      return EIO;
  }
}

void set_errno_from_last_error() { errno = errno_from(GetLastError()); }

HANDLE handle_of(int fd) { return reinterpret_cast<HANDLE>(_get_osfhandle(fd)); }

// ---- Files -------------------------------------------------------------------------------------

namespace {

constexpr DWORD kShareAll = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;

int descriptor_for(HANDLE h, int flags) {
  if (h == INVALID_HANDLE_VALUE) {
    set_errno_from_last_error();
    return -1;
  }
  const int fd = _open_osfhandle(reinterpret_cast<intptr_t>(h), flags | _O_BINARY);
  if (fd < 0) {
    CloseHandle(h);
    errno = EMFILE;
  }
  return fd;
}

int64_t nanoseconds_since_epoch(FILETIME t) {
  const uint64_t ticks = (uint64_t(t.dwHighDateTime) << 32) | t.dwLowDateTime;  // 100 ns since 1601
  return (static_cast<int64_t>(ticks) - 116444736000000000LL) * 100;
}

bool info_from_handle(HANDLE h, FileInfo* info) {
  BY_HANDLE_FILE_INFORMATION bh;
  if (!GetFileInformationByHandle(h, &bh)) {
    set_errno_from_last_error();
    return false;
  }
  info->directory = (bh.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) != 0;
  info->regular = !info->directory && GetFileType(h) == FILE_TYPE_DISK;
  info->size = (uint64_t(bh.nFileSizeHigh) << 32) | bh.nFileSizeLow;
  info->device = bh.dwVolumeSerialNumber;
  info->inode = (uint64_t(bh.nFileIndexHigh) << 32) | bh.nFileIndexLow;
  info->mtime_ns = nanoseconds_since_epoch(bh.ftLastWriteTime);
  return true;
}

OVERLAPPED at_offset(uint64_t offset) {
  OVERLAPPED ov{};
  ov.Offset = static_cast<DWORD>(offset);
  ov.OffsetHigh = static_cast<DWORD>(offset >> 32);
  return ov;
}

}  // namespace

int open_read(const std::string& path) {
  HANDLE h = CreateFileW(native_path(path).c_str(), GENERIC_READ, kShareAll, nullptr, OPEN_EXISTING,
                         FILE_ATTRIBUTE_NORMAL, nullptr);
  return descriptor_for(h, _O_RDONLY);
}

// Sector-aligned reads straight into the caller's buffer (the callers align buffers, offsets
// and lengths to kDirectAlign); the read queue reopens the file overlapped for its port.
int open_unbuffered(const std::string& path) {
  HANDLE h = CreateFileW(native_path(path).c_str(), GENERIC_READ, kShareAll, nullptr, OPEN_EXISTING,
                         FILE_ATTRIBUTE_NORMAL | FILE_FLAG_NO_BUFFERING, nullptr);
  return descriptor_for(h, _O_RDONLY);
}

int create_for_write(const std::string& path, bool exclusive) {
  HANDLE h = CreateFileW(native_path(path).c_str(), GENERIC_WRITE, FILE_SHARE_READ | FILE_SHARE_DELETE, nullptr,
                         exclusive ? CREATE_NEW : CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  return descriptor_for(h, _O_WRONLY);
}

int close_file(int fd) { return _close(fd); }

bool stat_file(int fd, FileInfo* info) {
  const HANDLE h = handle_of(fd);
  if (h == INVALID_HANDLE_VALUE) {
    errno = EBADF;
    return false;
  }
  return info_from_handle(h, info);
}

bool stat_path(const std::string& path, FileInfo* info) {
  // No access rights asked: attributes only. BACKUP_SEMANTICS opens directories too.
  HANDLE h = CreateFileW(native_path(path).c_str(), 0, kShareAll, nullptr, OPEN_EXISTING,
                         FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (h == INVALID_HANDLE_VALUE) {
    set_errno_from_last_error();
    return false;
  }
  const bool ok = info_from_handle(h, info);
  CloseHandle(h);
  return ok;
}

int64_t pread(int fd, void* dst, size_t length, uint64_t offset) {
  const HANDLE h = handle_of(fd);
  OVERLAPPED ov = at_offset(offset);
  DWORD got = 0;
  const DWORD want = static_cast<DWORD>(std::min<size_t>(length, size_t{1} << 30));
  if (!ReadFile(h, dst, want, &got, &ov)) {
    const DWORD e = GetLastError();
    if (e == ERROR_HANDLE_EOF) return 0;
    errno = errno_from(e);
    return -1;
  }
  return got;
}

int64_t preadv(int fd, const IoSpan* spans, int count, uint64_t offset) {
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t n = pread(fd, spans[i].dst, static_cast<size_t>(spans[i].length), offset + uint64_t(total));
    if (n < 0) return total > 0 ? total : n;
    total += n;
    if (uint64_t(n) < spans[i].length) break;
  }
  return total;
}

int64_t pwrite(int fd, const void* src, size_t length, uint64_t offset) {
  const HANDLE h = handle_of(fd);
  OVERLAPPED ov = at_offset(offset);
  DWORD put = 0;
  const DWORD want = static_cast<DWORD>(std::min<size_t>(length, size_t{1} << 30));
  if (!WriteFile(h, src, want, &put, &ov)) {
    set_errno_from_last_error();
    return -1;
  }
  return put;
}

int64_t write(int fd, const void* src, size_t length) {
  const HANDLE h = handle_of(fd);
  DWORD put = 0;
  const DWORD want = static_cast<DWORD>(std::min<size_t>(length, size_t{1} << 30));
  if (!WriteFile(h, src, want, &put, nullptr)) {
    set_errno_from_last_error();
    return -1;
  }
  return put;
}

bool sync_data(int fd) {
  if (FlushFileBuffers(handle_of(fd))) return true;
  set_errno_from_last_error();
  return false;
}

void drop_cached_pages(int) {}  // Windows trims its file cache itself
void advise_read(int, uint64_t, uint64_t) {}  // unbuffered reads go straight to the device
void sync_directory(const std::string&) {}  // NTFS journals the rename

bool rename_replace(const std::string& from, const std::string& to) {
  if (MoveFileExW(native_path(from).c_str(), native_path(to).c_str(), MOVEFILE_REPLACE_EXISTING)) return true;
  set_errno_from_last_error();
  return false;
}

bool remove_file(const std::string& path) {
  if (DeleteFileW(native_path(path).c_str())) return true;
  set_errno_from_last_error();
  return false;
}

bool make_directory(const std::string& path) {
  if (CreateDirectoryW(native_path(path).c_str(), nullptr)) return true;
  if (GetLastError() != ERROR_ALREADY_EXISTS) {
    set_errno_from_last_error();
    return false;
  }
  FileInfo info;
  return stat_path(path, &info) && info.directory;
}

bool can_write_directory(const std::string& dir) {
  const DWORD attrs = GetFileAttributesW(native_path(dir).c_str());
  return attrs != INVALID_FILE_ATTRIBUTES && (attrs & FILE_ATTRIBUTE_DIRECTORY) != 0 &&
         (attrs & FILE_ATTRIBUTE_READONLY) == 0;
}

void touch_file(const std::string& path) {
  HANDLE h = CreateFileW(native_path(path).c_str(), FILE_WRITE_ATTRIBUTES, kShareAll, nullptr, OPEN_EXISTING,
                         FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h == INVALID_HANDLE_VALUE) return;
  FILETIME now;
  GetSystemTimeAsFileTime(&now);
  SetFileTime(h, nullptr, nullptr, &now);
  CloseHandle(h);
}

std::FILE* fopen_utf8(const std::string& path, const char* mode) {
  return _wfopen(native_path(path).c_str(), widen(mode).c_str());
}

std::filesystem::path fs_path(const std::string& utf8) { return std::filesystem::path(widen(utf8)); }
std::string utf8_path(const std::filesystem::path& path) {
  std::wstring w = path.wstring();
  std::replace(w.begin(), w.end(), L'\\', L'/');
  return narrow(w);
}

// ---- Memory and CPU ---------------------------------------------------------------------------

namespace {

// Large pages need SeLockMemoryPrivilege (granted by policy: "Lock pages in memory"), enabled
// in the process token. Decided once, said once on stderr.
size_t large_page_bytes() {
  static const size_t bytes = [] {
    const size_t minimum = GetLargePageMinimum();
    HANDLE token;
    bool enabled = false;
    if (minimum > 0 && OpenProcessToken(GetCurrentProcess(), TOKEN_ADJUST_PRIVILEGES | TOKEN_QUERY, &token)) {
      TOKEN_PRIVILEGES tp{};
      tp.PrivilegeCount = 1;
      tp.Privileges[0].Attributes = SE_PRIVILEGE_ENABLED;
      if (LookupPrivilegeValueW(nullptr, L"SeLockMemoryPrivilege", &tp.Privileges[0].Luid)) {
        AdjustTokenPrivileges(token, FALSE, &tp, 0, nullptr, nullptr);
        enabled = GetLastError() == ERROR_SUCCESS;
      }
      CloseHandle(token);
    }
    if (!enabled)
      std::fputs("dsv4: note: large pages are off (the account lacks \"Lock pages in memory\"); using 4 KiB pages\n",
                 stderr);
    return enabled ? minimum : size_t{0};
  }();
  return bytes;
}

}  // namespace

uint8_t* allocate_pages(size_t bytes) {
  const size_t large = large_page_bytes();
  if (large > 0 && bytes >= large) {
    const size_t rounded = (bytes + large - 1) / large * large;
    if (void* p = VirtualAlloc(nullptr, rounded, MEM_RESERVE | MEM_COMMIT | MEM_LARGE_PAGES, PAGE_READWRITE))
      return static_cast<uint8_t*>(p);
  }
  // 2 MiB-aligned like the other systems: reserve 2 MiB more, commit the aligned part.
  constexpr size_t kAlign = size_t{2} << 20;
  const size_t size = std::max<size_t>(bytes, 1);
  void* base = VirtualAlloc(nullptr, size + kAlign, MEM_RESERVE, PAGE_NOACCESS);
  if (!base) return nullptr;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + kAlign - 1) / kAlign * kAlign;
  void* p = VirtualAlloc(reinterpret_cast<void*>(start), size, MEM_COMMIT, PAGE_READWRITE);
  if (!p) VirtualFree(base, 0, MEM_RELEASE);
  return static_cast<uint8_t*>(p);
}

void free_pages(uint8_t* p, size_t) {
  if (!p) return;
  MEMORY_BASIC_INFORMATION info{};
  if (VirtualQuery(p, &info, sizeof info)) VirtualFree(info.AllocationBase, 0, MEM_RELEASE);
}

void* aligned_alloc(size_t align, size_t bytes) { return _aligned_malloc(std::max<size_t>(bytes, 1), align); }
void aligned_free(void* p) { _aligned_free(p); }
void release_free_memory() { _heapmin(); }

uint64_t peak_rss_bytes() {
  PROCESS_MEMORY_COUNTERS pmc{};
  return GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc) ? pmc.PeakWorkingSetSize : 0;
}

uint64_t current_rss_bytes() {
  PROCESS_MEMORY_COUNTERS pmc{};
  return GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc) ? pmc.WorkingSetSize : 0;
}

uint64_t available_memory_bytes() {
  MEMORYSTATUSEX ms{};
  ms.dwLength = sizeof ms;
  return GlobalMemoryStatusEx(&ms) ? ms.ullAvailPhys : 0;
}

uint64_t total_memory_bytes() {
  MEMORYSTATUSEX ms{};
  ms.dwLength = sizeof ms;
  return GlobalMemoryStatusEx(&ms) ? ms.ullTotalPhys : 0;
}

int cpu_count() {
  DWORD_PTR process = 0, system = 0;
  if (GetProcessAffinityMask(GetCurrentProcess(), &process, &system) && process != 0)
    return std::max(1, __builtin_popcountll(static_cast<unsigned long long>(process)));
  SYSTEM_INFO si;
  GetSystemInfo(&si);
  return std::max<int>(1, static_cast<int>(si.dwNumberOfProcessors));
}

bool load_average(double*) { return false; }
char** environment() { return _environ; }

const char* os_name() { return "Windows"; }
const char* native_read_queue_name() { return "IOCP"; }

// ---- Console, processes, Ctrl-C -------------------------------------------------------------

namespace {
// Ctrl-C handlers are process-wide by nature (one console); these are set once in main's
// thread before a press can arrive.
void (*g_interrupt_handler)() = nullptr;
std::atomic<uint64_t> g_interrupts{0};

BOOL WINAPI on_console_interrupt(DWORD event) {
  if (event != CTRL_C_EVENT && event != CTRL_BREAK_EVENT) return FALSE;
  g_interrupts.fetch_add(1);
  if (g_interrupt_handler) g_interrupt_handler();
  return TRUE;
}
}  // namespace

void init_console() {
  SetConsoleOutputCP(CP_UTF8);
  SetConsoleCP(CP_UTF8);
  // Binary stdio: "\n" stays "\n" (JSON lines, SSE), as on the other systems.
  _setmode(_fileno(stdin), _O_BINARY);
  _setmode(_fileno(stdout), _O_BINARY);
  _setmode(_fileno(stderr), _O_BINARY);
}

std::vector<std::string> utf8_arguments(int argc, char** argv) {
  int n = 0;
  LPWSTR* wide = CommandLineToArgvW(GetCommandLineW(), &n);
  if (!wide) return std::vector<std::string>(argv, argv + argc);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(narrow(wide[i]));
  LocalFree(wide);
  return out;
}

bool is_terminal(int fd) {
  const HANDLE h = handle_of(fd);
  DWORD mode;
  return h != INVALID_HANDLE_VALUE && GetFileType(h) == FILE_TYPE_CHAR && GetConsoleMode(h, &mode);
}

bool is_terminal(std::FILE* f) { return is_terminal(_fileno(f)); }

int64_t read_stdin(void* dst, size_t length) {
  const uint64_t before = g_interrupts.load();
  DWORD got = 0;
  const BOOL ok = ReadFile(GetStdHandle(STD_INPUT_HANDLE), dst, static_cast<DWORD>(length), &got, nullptr);
  // Ctrl-C ends a console read with nothing read (ERROR_OPERATION_ABORTED, or success with 0
  // bytes); the handler counted it.
  if ((!ok || got == 0) && g_interrupts.load() != before) {
    errno = EINTR;
    return -1;
  }
  if (!ok) {
    const DWORD e = GetLastError();
    if (e == ERROR_BROKEN_PIPE || e == ERROR_HANDLE_EOF) return 0;
    errno = errno_from(e);
    return -1;
  }
  return got;
}

void write_fd(int fd, const char* text, size_t length) {
  const HANDLE h = handle_of(fd);
  while (length > 0) {
    DWORD put = 0;
    if (!WriteFile(h, text, static_cast<DWORD>(length), &put, nullptr) || put == 0) return;
    text += put;
    length -= put;
  }
}

int process_id() { return static_cast<int>(GetCurrentProcessId()); }

bool process_alive(int pid) {
  if (pid <= 0) return false;
  HANDLE h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(pid));
  if (!h) return GetLastError() == ERROR_ACCESS_DENIED;  // exists, but not ours to look at
  DWORD code = 0;
  const bool alive = GetExitCodeProcess(h, &code) && code == STILL_ACTIVE;
  CloseHandle(h);
  return alive;
}

std::string executable_path() {
  std::wstring buf(32768, L'\0');
  const DWORD n = GetModuleFileNameW(nullptr, buf.data(), static_cast<DWORD>(buf.size()));
  if (n == 0 || n >= buf.size()) return "";
  buf.resize(n);
  if (buf.rfind(L"\\\\?\\", 0) == 0) buf.erase(0, 4);
  std::replace(buf.begin(), buf.end(), L'\\', L'/');
  return narrow(buf);
}

void exit_now(int code) {
  std::fflush(stderr);
  TerminateProcess(GetCurrentProcess(), static_cast<UINT>(code));
  ::_exit(code);
}

int run_shell(const std::string& command, std::string* output) {
  if (!output) return _wsystem(widen(command).c_str());
  FILE* f = _wpopen(widen(command).c_str(), L"rb");
  if (!f) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) output->append(buf, n);
  return _pclose(f);
}

int run_program(const std::string& command_line, const std::string& stdin_path, const std::string& stdout_path,
                const std::string& stderr_path, int timeout_s) {
  SECURITY_ATTRIBUTES inherit{sizeof inherit, nullptr, TRUE};
  auto open = [&](const std::string& path, bool write) {
    return CreateFileW(native_path(path).c_str(), write ? GENERIC_WRITE : GENERIC_READ,
                       FILE_SHARE_READ | FILE_SHARE_WRITE, &inherit, write ? CREATE_ALWAYS : OPEN_EXISTING,
                       FILE_ATTRIBUTE_NORMAL, nullptr);
  };
  PROCESS_INFORMATION process{};
  // A start that fails is tried again a few times, then reported with Windows' reason: once in
  // CI (2026-12-07, a fresh wine prefix) one start of dsv4.exe gave -1 and said nothing.
  DWORD last_error = 0;
  bool started = false;
  for (int attempt = 0; attempt < 4 && !started; ++attempt) {
    if (attempt > 0) Sleep(250u << attempt);
    HANDLE in = open(stdin_path, false), out = open(stdout_path, true), err = open(stderr_path, true);
    STARTUPINFOW startup{};
    startup.cb = sizeof startup;
    startup.dwFlags = STARTF_USESTDHANDLES;
    startup.hStdInput = in;
    startup.hStdOutput = out;
    startup.hStdError = err;
    std::wstring line = widen(command_line);  // CreateProcessW may write into it
    started = in != INVALID_HANDLE_VALUE && out != INVALID_HANDLE_VALUE && err != INVALID_HANDLE_VALUE &&
              CreateProcessW(nullptr, line.data(), nullptr, nullptr, TRUE, 0, nullptr, nullptr, &startup, &process);
    if (!started) last_error = GetLastError();
    for (HANDLE h : {in, out, err})
      if (h != INVALID_HANDLE_VALUE) CloseHandle(h);
  }
  if (!started) {
    std::fprintf(stderr, "dsv4: cannot start %s: Windows error %lu\n", command_line.c_str(),
                 static_cast<unsigned long>(last_error));
    return -1;
  }
  int code = 124;
  if (WaitForSingleObject(process.hProcess, DWORD(std::max(timeout_s, 0)) * 1000u) == WAIT_TIMEOUT) {
    TerminateProcess(process.hProcess, 124);
    WaitForSingleObject(process.hProcess, INFINITE);
  } else {
    DWORD exit_code = 0;
    GetExitCodeProcess(process.hProcess, &exit_code);
    code = int(exit_code);
  }
  CloseHandle(process.hThread);
  CloseHandle(process.hProcess);
  return code;
}

void ignore_broken_pipe() {}  // Winsock reports a closed peer as an error, never a signal

void on_interrupt(void (*handler)()) {
  g_interrupt_handler = handler;
  SetConsoleCtrlHandler(on_console_interrupt, TRUE);
}

// The console runs its control handlers on a thread of its own, so the watcher's callback is
// called from there directly: Ctrl-C / Ctrl-Break are interrupts; closing the console, logoff
// and shutdown ask to terminate.
struct SignalThread::State {
  std::function<void(bool)> on_signal;
};

namespace {
std::atomic<SignalThread::State*> g_signal_thread{nullptr};

BOOL WINAPI on_console_signal(DWORD event) {
  SignalThread::State* s = g_signal_thread.load();
  if (!s) return FALSE;
  s->on_signal(event == CTRL_C_EVENT || event == CTRL_BREAK_EVENT);
  return TRUE;
}
}  // namespace

SignalThread::SignalThread(std::function<void(bool interrupt)> on_signal) : state_(new State{std::move(on_signal)}) {
  g_signal_thread.store(state_);
  SetConsoleCtrlHandler(on_console_signal, TRUE);
}

SignalThread::~SignalThread() {
  SetConsoleCtrlHandler(on_console_signal, FALSE);
  g_signal_thread.store(nullptr);
  delete state_;
}

}  // namespace dsv4::platform
