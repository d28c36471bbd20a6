#include "dsv4/io/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

constexpr uint64_t kBufferBytes = 16ull << 20;

void write_all(int fd, const uint8_t* data, uint64_t bytes, const std::string& path) {
  while (bytes > 0) {
    const int64_t n = platform::write(fd, data, static_cast<size_t>(std::min<uint64_t>(bytes, 1ull << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: write failed: {}", path, std::strerror(errno));
    }
    data += n;
    bytes -= static_cast<uint64_t>(n);
  }
}

}  // namespace

uint64_t TensorDecl::bytes() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n * static_cast<uint64_t>(dtype_size(dtype));
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorDecl> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_path_(path_ + ".partial") {
  // The header lists tensors in file order; nlohmann's ordered_json keeps that order, so
  // readers that sort by offset and readers that keep header order agree.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorDecl& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail("{}: invalid tensor name \"{}\"", path_, t.name);
    if (!seen.insert(t.name).second) fail("{}: tensor {} declared twice", path_, t.name);
    const uint64_t bytes = t.bytes();
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  total_ = offset;
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  while ((8 + text.size()) % 8) text += ' ';
  data_start_ = 8 + text.size();

  fd_ = platform::create_for_write(tmp_path_, false);
  if (fd_ < 0) fail("{}: cannot create: {}", tmp_path_, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));
  write_all(fd_, len, 8, tmp_path_);
  write_all(fd_, reinterpret_cast<const uint8_t*>(text.data()), text.size(), tmp_path_);
  buffer_.resize(kBufferBytes);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) platform::close_file(fd_);
  if (!finished_) platform::remove_file(tmp_path_);
}

void SafetensorsWriter::flush() {
  write_all(fd_, buffer_.data(), used_, tmp_path_);
  used_ = 0;
}

uint8_t* SafetensorsWriter::reserve(uint64_t bytes) {
  if (bytes > buffer_.size()) fail("{}: reserve of {} bytes exceeds the write buffer", path_, bytes);
  if (written_ + bytes > total_)
    fail("{}: {} bytes written but the declared tensors hold {}", path_, written_ + bytes, total_);
  if (used_ + bytes > buffer_.size()) flush();
  uint8_t* p = buffer_.data() + used_;
  used_ += bytes;
  written_ += bytes;
  return p;
}

void SafetensorsWriter::write(const void* data, uint64_t bytes) {
  const auto* src = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const uint64_t take = std::min<uint64_t>(bytes, buffer_.size());
    std::memcpy(reserve(take), src, take);
    src += take;
    bytes -= take;
  }
}

void SafetensorsWriter::finish(bool drop_page_cache) {
  if (written_ != total_) fail("{}: only {} of {} tensor bytes were written", path_, written_, total_);
  flush();
  if (drop_page_cache) {
    // Written pages are dirty: write them back, then let the kernel drop them, so a big
    // synthetic checkpoint does not crowd other processes out of the page cache.
    if (!platform::sync_data(fd_)) fail("{}: fdatasync failed: {}", tmp_path_, std::strerror(errno));
    platform::drop_cached_pages(fd_);
  }
  if (platform::close_file(fd_) != 0) {
    fd_ = -1;
    fail("{}: close failed: {}", tmp_path_, std::strerror(errno));
  }
  fd_ = -1;
  if (!platform::rename_replace(tmp_path_, path_))
    fail("{}: cannot rename from {}: {}", path_, tmp_path_, std::strerror(errno));
  finished_ = true;
}

void write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size) {
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total_size}};
  j["weight_map"] = weight_map;  // std::map: sorted by tensor name, as the hub's index is
  const std::string text = j.dump(2) + "\n";
  const std::string tmp = path + ".partial";
  const int fd = platform::create_for_write(tmp, false);
  if (fd < 0) fail("{}: cannot create: {}", tmp, std::strerror(errno));
  try {
    write_all(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), tmp);
  } catch (...) {
    platform::close_file(fd);
    platform::remove_file(tmp);
    throw;
  }
  platform::close_file(fd);
  if (!platform::rename_replace(tmp, path)) fail("{}: cannot rename from {}", path, tmp);
}

}  // namespace dsv4
