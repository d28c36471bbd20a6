// Reader for one .safetensors file: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
// Everything in the header is validated before any tensor is used: dtype known, shape
// non-negative, byte count == numel x element width, offsets inside the file, no overlap.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/util/file.h"

namespace dsv4 {

enum class DType : uint8_t {
  kF64, kF32, kF16, kBF16, kF8_E4M3, kF8_E5M2, kF8_E8M0,
  kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64, kBool,
};

const char* dtype_name(DType d);
int dtype_size(DType d);
bool parse_dtype(std::string_view name, DType* out);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute file offset of the first byte
  uint64_t bytes = 0;

  int64_t numel() const;
  std::string shape_string() const;  // "[2048, 4096]"
};

// Largest header accepted; real V4 shards have headers of a few hundred KiB.
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

// The first 8 + header-length bytes of a safetensors file: what fixes where every tensor
// lies. Throws Error naming the path if the file is too short or the length is implausible.
std::string read_raw_header(const File& file);

class SafetensorsFile {
 public:
  // Opens and validates; throws Error naming the file (and tensor) on any problem.
  static SafetensorsFile open(const std::string& path);
  // Validates a header held in memory as if it came from a file of `file_size` bytes.
  // Used by the fuzzer and by tests.
  static std::vector<TensorInfo> parse_header(std::string_view header_json, uint64_t data_start,
                                              uint64_t file_size, const std::string& path);

  const std::string& path() const { return file_.path(); }
  const File& file() const { return file_; }
  uint64_t size() const { return size_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;

  // Reads a whole tensor's bytes into dst (dst must hold info.bytes).
  void read(const TensorInfo& info, void* dst) const { file_.read_exact(dst, info.bytes, info.offset); }

 private:
  File file_;
  uint64_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
};

}  // namespace dsv4
