// Writer for .safetensors files and the hub's model.safetensors.index.json. Tensors are
// declared up front (the header must hold every offset), then their bytes are streamed in
// declaration order through a large buffer, so multi-GiB shards never sit in RAM. The file
// is written under a temporary name and renamed by finish(): a failed run leaves no
// truncated shard behind.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dsv4/io/safetensors.h"

namespace dsv4 {

struct TensorDecl {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t bytes() const;  // numel x element width
};

class SafetensorsWriter {
 public:
  // Declares the file's tensors; their bytes follow in this order. Writes the header.
  // Throws Error naming the path on a duplicate name or an I/O error.
  SafetensorsWriter(std::string path, std::vector<TensorDecl> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // an unfinished file is removed
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends tensor bytes (may span tensor boundaries). Writing past the declared total
  // is an error.
  void write(const void* data, uint64_t bytes);
  // A writable window of `bytes` (at most buffer_capacity()) inside the write buffer; the
  // caller fills it completely, which saves a copy for generated data.
  uint8_t* reserve(uint64_t bytes);
  uint64_t buffer_capacity() const { return buffer_.size(); }

  // Checks every declared byte was written, flushes, optionally drops the file from the
  // page cache, and renames the file into place.
  void finish(bool drop_page_cache = false);

  const std::string& path() const { return path_; }
  uint64_t data_bytes() const { return total_; }
  uint64_t file_bytes() const { return data_start_ + total_; }

 private:
  void flush();

  std::string path_, tmp_path_;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
  uint64_t used_ = 0;     // bytes pending in buffer_
  uint64_t written_ = 0;  // tensor bytes accepted so far
  uint64_t total_ = 0;
  uint64_t data_start_ = 0;
  bool finished_ = false;
};

// Writes model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {...}}.
void write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size);

}  // namespace dsv4
