// Sessions as bytes, for the persistent prefix cache: every field in visit_fields' order,
// little-endian (the machine's own order; the cache keys entries by the dsv4 build, so bytes
// never travel between machines of different layouts), a vector as a u64 count and its
// elements. The reader checks every count against the bytes left, so a truncated or garbled
// stream throws Error instead of allocating or reading past its end.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsv4/model/session.h"

namespace dsv4 {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void* data, size_t n) = 0;
};

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Throws Error when fewer than n bytes are left.
  virtual void read(void* data, size_t n) = 0;
  virtual uint64_t remaining() const = 0;
};

void write_session(const SessionState& s, ByteSink& out);
SessionState read_session(ByteSource& in);
// The number of bytes write_session produces.
uint64_t serialized_session_bytes(const SessionState& s);

}  // namespace dsv4
