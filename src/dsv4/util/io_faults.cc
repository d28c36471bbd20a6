#include "dsv4/util/io_faults.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (;;) {
    const size_t end = s.find(sep, begin);
    out.push_back(s.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

uint64_t parse_count(const std::string& v, const std::string& rule, const std::string& source) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 18)
    fail("{}: rule \"{}\": expected a non-negative integer, got \"{}\"", source, rule, v);
  return std::strtoull(v.c_str(), nullptr, 10);
}

}  // namespace

std::vector<IoFaults::Rule> IoFaults::parse_rules(const std::string& spec, const std::string& source) {
  std::vector<Rule> rules;
  for (const std::string& text : split(spec, ';')) {
    if (text.empty()) continue;
    const std::vector<std::string> fields = split(text, ':');
    Rule r;
    const std::string& kind = fields[0];
    if (kind == "eio") {
      r.kind = Kind::kEio;
    } else if (kind == "short") {
      r.kind = Kind::kShort;
    } else if (kind == "eof") {
      r.kind = Kind::kEof;
    } else if (kind == "rate") {
      r.kind = Kind::kRate;
      r.count = 0;
    } else {
      fail("{}: rule \"{}\": unknown kind \"{}\" (expected eio, short, eof or rate)", source, text, kind);
    }
    for (size_t i = 1; i < fields.size(); ++i) {
      const size_t eq = fields[i].find('=');
      if (eq == std::string::npos) fail("{}: rule \"{}\": expected key=value, got \"{}\"", source, text, fields[i]);
      const std::string key = fields[i].substr(0, eq), value = fields[i].substr(eq + 1);
      if (key == "path") {
        r.path = value;
      } else if (key == "offset") {
        r.has_offset = true;
        r.offset = parse_count(value, text, source);
      } else if (key == "after") {
        r.after = parse_count(value, text, source);
      } else if (key == "count") {
        r.count = parse_count(value, text, source);
      } else if (key == "mbps") {
        char* end = nullptr;
        const double mbps = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(mbps > 0) || mbps > 1e9)
          fail("{}: rule \"{}\": mbps must be a positive number, got \"{}\"", source, text, value);
        r.bytes_per_s = mbps * 1e6;
      } else {
        fail("{}: rule \"{}\": unknown key \"{}\" (expected path, offset, after, count or mbps)", source, text, key);
      }
    }
    if (r.kind == Kind::kRate && r.bytes_per_s <= 0) fail("{}: rule \"{}\": a rate rule needs mbps=X", source, text);
    if (r.kind != Kind::kRate && r.bytes_per_s > 0) fail("{}: rule \"{}\": mbps is for rate rules", source, text);
    rules.push_back(std::move(r));
  }
  if (rules.empty()) fail("{}: no rules in \"{}\"", source, spec);
  return rules;
}

double IoFaults::now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void IoFaults::wait_until(double not_before) {
  // A sleep may end a little early (wine's timers run on another clock than steady_clock's:
  // CI saw 6.43 ms for 6.55), so it is repeated until the time has come.
  for (double wait; (wait = not_before - now()) > 0;) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
}

IoFaults::Action IoFaults::before_read(const std::string& path, uint64_t offset, uint64_t length) {
  Action a;
  a.length = length;
  std::lock_guard<std::mutex> lock(mutex_);
  bool faulted = false;
  for (Rule& r : rules_) {
    if (!r.path.empty() && path.find(r.path) == std::string::npos) continue;
    if (r.has_offset && (r.offset < offset || r.offset >= offset + length)) continue;
    if (r.seen++ < r.after) continue;
    if (r.count != 0 && r.applied >= r.count) continue;
    if (r.kind == Kind::kRate) {
      ++r.applied;
      const double start = std::max(now(), r.next_free);
      r.next_free = start + double(length) / r.bytes_per_s;
      a.not_before = std::max(a.not_before, r.next_free);
      continue;
    }
    if (faulted) continue;  // one fault per read; the others keep their turn
    if (r.kind == Kind::kShort) {
      const uint64_t half = length / 2 / 4096 * 4096;
      if (half == 0) continue;  // too short to shorten on a 4 KiB grid
      a.length = half;
    } else if (r.kind == Kind::kEof) {
      a.eof = true;
    } else {
      a.error = EIO;
    }
    ++r.applied;
    ++injected_;
    faulted = true;
  }
  return a;
}

void IoFaults::set_rules(std::vector<Rule> rules) {
  std::lock_guard<std::mutex> lock(mutex_);
  rules_ = std::move(rules);
}

uint64_t IoFaults::injected() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return injected_;
}

IoFaults::Action consult_faults(IoFaults* faults, const std::string& path, uint64_t offset, uint64_t length) {
  if (faults) return faults->before_read(path, offset, length);
  IoFaults::Action a;
  a.length = length;
  return a;
}

int64_t faulty_pread(IoFaults* faults, const std::string& path, int fd, void* dst, size_t length, uint64_t offset) {
  if (!faults) return platform::pread(fd, dst, length, offset);
  const IoFaults::Action a = faults->before_read(path, offset, length);
  int64_t n = 0;
  int err = 0;
  if (a.error) {
    n = -1;
    err = a.error;
  } else if (!a.eof) {
    n = platform::pread(fd, dst, a.length, offset);
    err = n < 0 ? errno : 0;
  }
  IoFaults::wait_until(a.not_before);
  errno = err;
  return n;
}

int64_t faulty_preadv(IoFaults* faults, const std::string& path, int fd, const platform::IoSpan* spans, int count,
                      uint64_t offset) {
  if (!faults) return platform::preadv(fd, spans, count, offset);
  uint64_t total = 0;
  for (int i = 0; i < count; ++i) total += spans[i].length;
  const IoFaults::Action a = faults->before_read(path, offset, total);
  int64_t n = 0;
  int err = 0;
  if (a.error) {
    n = -1;
    err = a.error;
  } else if (!a.eof) {
    // The rule may shorten the read: only the spans (and the part of the last) it allows.
    platform::IoSpan cut[platform::kMaxIoSpans];
    int used = 0;
    for (uint64_t left = a.length; used < count && used < platform::kMaxIoSpans && left > 0; ++used) {
      cut[used] = {spans[used].dst, std::min(spans[used].length, left)};
      left -= cut[used].length;
    }
    n = platform::preadv(fd, cut, used, offset);
    err = n < 0 ? errno : 0;
  }
  IoFaults::wait_until(a.not_before);
  errno = err;
  return n;
}

}  // namespace dsv4
