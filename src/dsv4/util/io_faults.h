// A fault layer for tests and benchmarks: reads that match a rule fail with EIO, come back
// short, end early, or complete no faster than a given rate. The expert read queues (both
// io_uring and the pread threads) and the bulk reader of the load consult it before every
// read syscall, so a test can break exactly the read it means to, at load, prefill or decode.
//
// Spec (DSV4_TEST_IO_FAULTS, or built in a test): rules separated by ';', each
// KIND[:key=value]...
//   eio     the read fails with EIO
//   short   the read returns half of what was asked (4 KiB multiples): the caller continues
//   eof     the read returns 0 bytes, as if the file ended there
//   rate    reads of matching files are served one after another at `mbps` MB/s, like one
//           device of that bandwidth (each rate rule is its own device)
// keys: path=TEXT   only files whose path contains TEXT
//       offset=N    only reads covering byte N of the file
//       after=N     let the first N matching reads through
//       count=N     affect this many matching reads (0: all of them; default 1; rate: all)
//       mbps=X      rate only
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dsv4 {
namespace platform {
struct IoSpan;
}

class IoFaults {
 public:
  enum class Kind : uint8_t { kEio, kShort, kEof, kRate };
  struct Rule {
    Kind kind = Kind::kEio;
    std::string path;
    bool has_offset = false;
    uint64_t offset = 0;
    uint64_t after = 0;
    uint64_t count = 1;  // 0: unlimited
    double bytes_per_s = 0;
    // State.
    uint64_t seen = 0, applied = 0;
    double next_free = 0;  // rate: when the modelled device is idle again (steady seconds)
  };
  // What one read should do instead of (or besides) the real syscall.
  struct Action {
    int error = 0;         // nonzero: fail with this errno, no syscall
    bool eof = false;      // return 0 bytes, no syscall
    uint64_t length = 0;   // bytes to ask the kernel for (may be shorter than asked)
    double not_before = 0; // rate: report completion no earlier than this (steady seconds)
  };

  // Throws Error naming `source` (e.g. "DSV4_TEST_IO_FAULTS") on a malformed spec.
  static std::vector<Rule> parse_rules(const std::string& spec, const std::string& source);
  static std::shared_ptr<IoFaults> parse(const std::string& spec, const std::string& source) {
    return std::make_shared<IoFaults>(parse_rules(spec, source));
  }
  // Null for an empty spec (no fault layer).
  static std::shared_ptr<IoFaults> parse_if_set(const std::string& spec, const std::string& source) {
    return spec.empty() ? nullptr : parse(spec, source);
  }
  explicit IoFaults(std::vector<Rule> rules = {}) : rules_(std::move(rules)) {}

  Action before_read(const std::string& path, uint64_t offset, uint64_t length);
  uint64_t injected() const;  // faults (eio, short, eof) applied so far
  void set_rules(std::vector<Rule> rules);  // e.g. a drive that fails after the load
  void clear() { set_rules({}); }           // reads are plain from now on

  // Sleeps until `not_before` (for readers that block: the pread threads, the bulk reader).
  static void wait_until(double not_before);
  static double now();

 private:
  mutable std::mutex mutex_;
  std::vector<Rule> rules_;
  uint64_t injected_ = 0;
};

// The verdict on one read of `path`: the fault layer's, or a plain read of `length` bytes when
// `faults` is null. For readers that issue the syscall themselves (io_uring).
IoFaults::Action consult_faults(IoFaults* faults, const std::string& path, uint64_t offset, uint64_t length);

// platform::pread through the fault layer (a plain pread when `faults` is null): returns what pread
// returns, with errno set on failure, after a rate rule's wait. Every blocking reader (the
// load's bulk reader, the pread threads of the expert read queue) reads through this.
int64_t faulty_pread(IoFaults* faults, const std::string& path, int fd, void* dst, size_t length, uint64_t offset);
// The same for a vectored read (platform::preadv): the rule sees the whole request, and a
// shortened read fills the first spans.
int64_t faulty_preadv(IoFaults* faults, const std::string& path, int fd, const platform::IoSpan* spans, int count,
                      uint64_t offset);

}  // namespace dsv4
