#include "dsv4/io/safetensors.h"

#include <algorithm>
#include <cstring>

#include <simdjson.h>

#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

struct DTypeEntry {
  DType dtype;
  const char* name;
  int size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", 8},         {DType::kF32, "F32", 4},         {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},       {DType::kF8_E4M3, "F8_E4M3", 1}, {DType::kF8_E5M2, "F8_E5M2", 1},
    {DType::kF8_E8M0, "F8_E8M0", 1}, {DType::kI8, "I8", 1},           {DType::kU8, "U8", 1},
    {DType::kI16, "I16", 2},         {DType::kU16, "U16", 2},         {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},         {DType::kI64, "I64", 8},         {DType::kU64, "U64", 8},
    {DType::kBool, "BOOL", 1},
};

// Multiplies with an overflow check; a hostile shape must not wrap around.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

const char* dtype_name(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}

int dtype_size(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.size;
  return 0;
}

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& e : kDTypes) {
    if (name == e.name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<TensorInfo> SafetensorsFile::parse_header(std::string_view header_json, uint64_t data_start,
                                                      uint64_t file_size, const std::string& path) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(header_json);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root)) {
    fail("{}: header is not valid JSON: {}", path, simdjson::error_message(err));
  }
  simdjson::dom::object object;
  if (root.get_object().get(object)) fail("{}: header is not a JSON object", path);

  std::vector<TensorInfo> tensors;
  std::vector<std::string_view> seen;
  const uint64_t data_size = file_size - data_start;
  for (auto field : object) {
    std::string name(field.key);
    seen.push_back(field.key);
    if (name == "__metadata__") {
      simdjson::dom::object meta;
      if (field.value.get_object().get(meta)) fail("{}: __metadata__ is not an object", path);
      for (auto m : meta) {
        if (!m.value.is_string()) fail("{}: __metadata__.{} is not a string", path, std::string(m.key));
      }
      continue;
    }
    if (name.empty()) fail("{}: tensor with an empty name", path);
    simdjson::dom::object desc;
    if (field.value.get_object().get(desc)) fail("{}: tensor {}: description is not an object", path, name);

    TensorInfo info;
    info.name = name;
    std::string_view dtype_str;
    if (desc["dtype"].get_string().get(dtype_str)) fail("{}: tensor {}: missing or non-string dtype", path, name);
    if (!parse_dtype(dtype_str, &info.dtype)) fail("{}: tensor {}: unknown dtype \"{}\"", path, name, dtype_str);

    simdjson::dom::array shape;
    if (desc["shape"].get_array().get(shape)) fail("{}: tensor {}: missing or non-array shape", path, name);
    uint64_t numel = 1;
    for (auto dim : shape) {
      int64_t d;
      if (dim.get_int64().get(d) || d < 0) fail("{}: tensor {}: shape has a non-integer or negative dimension", path, name);
      if (mul_overflows(numel, static_cast<uint64_t>(d), &numel)) fail("{}: tensor {}: shape overflows", path, name);
      info.shape.push_back(d);
    }
    if (info.shape.size() > 8) fail("{}: tensor {}: {} dimensions is too many", path, name, info.shape.size());

    simdjson::dom::array offsets;
    if (desc["data_offsets"].get_array().get(offsets) || offsets.size() != 2)
      fail("{}: tensor {}: data_offsets must be [begin, end]", path, name);
    uint64_t begin, end;
    if (offsets.at(0).get_uint64().get(begin) || offsets.at(1).get_uint64().get(end))
      fail("{}: tensor {}: data_offsets must be non-negative integers", path, name);
    if (end < begin) fail("{}: tensor {}: data_offsets end {} is before begin {}", path, name, end, begin);
    if (end > data_size)
      fail("{}: tensor {}: data_offsets [{}, {}] run past the end of the file ({} data bytes; truncated?)",
           path, name, begin, end, data_size);
    uint64_t expect;
    if (mul_overflows(numel, static_cast<uint64_t>(dtype_size(info.dtype)), &expect) || expect != end - begin)
      fail("{}: tensor {}: {} {} needs {} bytes but data_offsets hold {}", path, name, dtype_str,
           info.shape_string(), numel * dtype_size(info.dtype), end - begin);
    for (auto key : desc) {
      if (key.key != "dtype" && key.key != "shape" && key.key != "data_offsets")
        fail("{}: tensor {}: unexpected field \"{}\"", path, name, std::string(key.key));
    }
    info.offset = data_start + begin;
    info.bytes = end - begin;
    tensors.push_back(std::move(info));
  }

  std::sort(seen.begin(), seen.end());
  for (size_t i = 1; i < seen.size(); ++i)
    if (seen[i] == seen[i - 1]) fail("{}: tensor {} appears twice in the header", path, std::string(seen[i]));

  // Overlap check on the sorted byte ranges (empty tensors occupy nothing).
  std::vector<const TensorInfo*> order;
  for (const auto& t : tensors)
    if (t.bytes) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->bytes)
      fail("{}: tensors {} and {} overlap in the file", path, order[i - 1]->name, order[i]->name);
  }
  return tensors;
}

std::string read_raw_header(const File& file) {
  const uint64_t size = file.size();
  if (size < 8) fail("{}: too short to be a safetensors file ({} bytes)", file.path(), size);
  uint8_t len_bytes[8];
  file.read_exact(len_bytes, 8, 0);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxSafetensorsHeader || header_len > size - 8)
    fail("{}: header length {} is implausible for a file of {} bytes", file.path(), header_len, size);
  std::string raw(static_cast<size_t>(8 + header_len), '\0');
  file.read_exact(raw.data(), raw.size(), 0);
  return raw;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile st;
  st.file_ = File::open_read(path);
  st.size_ = st.file_.size();
  if (st.size_ < 8) fail("{}: too short to be a safetensors file ({} bytes)", path, st.size_);
  uint8_t len_bytes[8];
  st.file_.read_exact(len_bytes, 8, 0);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxSafetensorsHeader)
    fail("{}: header length {} exceeds the {} byte limit", path, header_len, kMaxSafetensorsHeader);
  if (header_len > st.size_ - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", path, header_len, st.size_);
  std::string header(static_cast<size_t>(header_len), '\0');
  st.file_.read_exact(header.data(), header_len, 8);
  st.tensors_ = parse_header(header, 8 + header_len, st.size_, path);
  for (size_t i = 0; i < st.tensors_.size(); ++i) st.by_name_.emplace(st.tensors_[i].name, i);
  return st;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace dsv4
