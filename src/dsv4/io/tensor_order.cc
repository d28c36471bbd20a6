#include "dsv4/io/tensor_order.h"

#include <algorithm>
#include <map>

#include "dsv4/io/checkpoint.h"
#include "dsv4/io/config.h"
#include "dsv4/io/safetensors.h"
#include "dsv4/io/schema.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

// The dtype's place in the safetensors library's `Dtype` enum (safetensors/src/tensor.rs):
// BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
// I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64. `Dtype` derives Ord, so this is the
// order its sort compares.
int safetensors_dtype_rank(DType d) {
  switch (d) {
    case DType::kBool: return 0;
    case DType::kU8: return 4;
    case DType::kI8: return 5;
    case DType::kF8_E5M2: return 6;
    case DType::kF8_E4M3: return 7;
    case DType::kF8_E8M0: return 8;
    case DType::kI16: return 11;
    case DType::kU16: return 12;
    case DType::kF16: return 13;
    case DType::kBF16: return 14;
    case DType::kI32: return 15;
    case DType::kU32: return 16;
    case DType::kF32: return 17;
    case DType::kF64: return 19;
    case DType::kI64: return 20;
    case DType::kU64: return 21;
  }
  return 0;
}

}  // namespace

TensorLayout parse_tensor_layout(const std::string& text) {
  if (text == "official") return TensorLayout::kOfficial;
  if (text == "contiguous") return TensorLayout::kContiguous;
  fail("--layout \"{}\": expected official or contiguous", text);
}

const char* tensor_layout_name(TensorLayout layout) {
  return layout == TensorLayout::kOfficial ? "official" : "contiguous";
}

// The safetensors library's `prepare` (safetensors/src/tensor.rs, huggingface/safetensors
// at 24b0b28) sorts with `right.dtype().cmp(&left.dtype()).then(lname.cmp(rname))`: dtype
// descending in enum order (so U64, I64, F32, BF16, F8_E8M0, F8_E4M3, I8 for V4), then name
// ascending, bytewise (Rust's str Ord). The data follow with no padding between tensors.
bool safetensors_before(DType a_dtype, const std::string& a_name, DType b_dtype, const std::string& b_name) {
  const int a = safetensors_dtype_rank(a_dtype), b = safetensors_dtype_rank(b_dtype);
  if (a != b) return a > b;
  return a_name < b_name;  // std::string compares as unsigned bytes, as Rust does
}

void sort_safetensors_order(std::vector<TensorDecl>& tensors) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorDecl& a, const TensorDecl& b) {
    return safetensors_before(a.dtype, a.name, b.dtype, b.name);
  });
}

void sort_module_order(std::vector<TensorDecl>& tensors, const ModelConfig& c) {
  std::map<std::string, size_t> rank;
  for (const TensorSpec& spec : expected_tensors(c)) rank.emplace(spec.name, rank.size());
  auto key = [&](const TensorDecl& t) {
    const auto it = rank.find(t.name);
    return it == rank.end() ? rank.size() : it->second;
  };
  std::stable_sort(tensors.begin(), tensors.end(), [&](const TensorDecl& a, const TensorDecl& b) {
    const size_t ka = key(a), kb = key(b);
    return ka != kb ? ka < kb : a.name < b.name;
  });
}

const char* shard_tensor_order(const SafetensorsFile& shard, const ModelConfig& c) {
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : shard.tensors()) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  std::map<std::string, size_t> rank;
  for (const TensorSpec& spec : expected_tensors(c)) rank.emplace(spec.name, rank.size());
  auto module_rank = [&](const TensorInfo* t) {
    const auto it = rank.find(t->name);
    return it == rank.end() ? rank.size() : it->second;
  };
  bool official = true, contiguous = true;
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo *a = by_offset[i - 1], *b = by_offset[i];
    official = official && safetensors_before(a->dtype, a->name, b->dtype, b->name);
    const size_t ra = module_rank(a), rb = module_rank(b);
    contiguous = contiguous && (ra < rb || (ra == rb && a->name < b->name));
  }
  return official ? "official" : contiguous ? "contiguous" : "other";
}

std::string checkpoint_tensor_order(const Checkpoint& ck) {
  std::string order;
  for (const auto& s : ck.shards()) {
    const std::string mine = shard_tensor_order(*s, ck.config());
    order = order.empty() || order == mine ? mine : "mixed";
  }
  return order;
}

int official_shard_of(const std::string& name, int num_layers) {
  auto index_after = [&](const std::string& prefix, int* out) {
    if (name.rfind(prefix, 0) != 0) return false;
    size_t at = prefix.size(), end = at;
    while (end < name.size() && end - at < 9 && name[end] >= '0' && name[end] <= '9') ++end;
    if (end == at || end >= name.size() || name[end] != '.') return false;
    *out = std::stoi(name.substr(at, end - at));
    return true;
  };
  int i = 0;
  if (index_after("layers.", &i) && i < num_layers) return 1 + i;
  if (index_after("mtp.", &i)) return num_layers + 2 + i;
  if (name == "embed.weight") return 0;
  return num_layers + 1;
}

}  // namespace dsv4
