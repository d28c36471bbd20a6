#include <cstdio>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>

#include "dsv4/cli/commands.h"
#include "dsv4/experts/expert_layout.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/io/schema.h"
#include "dsv4/io/tensor_order.h"
#include "dsv4/io/value_check.h"
#include "dsv4/util/file.h"
#include "dsv4/util/progress.h"

namespace dsv4::cli {
namespace {

bool is_routed_expert_tensor(const std::string& name) {
  return name.find(".ffn.experts.") != std::string::npos;
}

std::string human(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.2f} MiB", bytes / double(1ull << 20));
  return fmt::format("{:.1f} KiB", bytes / 1024.0);
}

// "expert 17 of layer 3: " for a routed expert's tensor, "" otherwise.
std::string expert_prefix(const ModelConfig& c, const std::string& name) {
  static const std::regex kExpert(R"(^(?:layers\.(\d+)|mtp\.(\d+))\.ffn\.experts\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, kExpert)) return "";
  const int layer = m[1].matched ? std::stoi(m[1]) : c.num_layers + std::stoi(m[2]);
  return fmt::format("expert {} of layer {}: ", m[3].str(), layer);
}

// The first bad element of a tensor's bytes [begin, begin + n) as the engine would judge it
// (the load and the expert store refuse the same values), or -1; `what` says what is bad.
int64_t first_bad_value(const TensorInfo& t, const uint8_t* p, int64_t n, int n_experts, std::string* what) {
  int64_t i = -1;
  switch (t.dtype) {
    case DType::kF8_E4M3:
      i = find_nan_e4m3(p, n);
      if (i >= 0) *what = fmt::format("a NaN encoding (0x{:02X})", p[i]);
      return i;
    case DType::kF8_E8M0:
      i = find_bad_e8m0(p, n);
      if (i >= 0) *what = fmt::format("the E8M0 scale {} (scales above 2^32 are refused)", describe_e8m0(p[i]));
      return i;
    case DType::kBF16:
      i = find_nonfinite_bf16(reinterpret_cast<const uint16_t*>(p), n / 2);
      if (i >= 0) *what = "a non-finite value";
      return i;
    case DType::kF32:
      i = find_nonfinite_f32(reinterpret_cast<const float*>(p), n / 4);
      if (i >= 0) *what = "a non-finite value";
      return i;
    case DType::kI64: {  // tid2eid: expert ids
      const auto* v = reinterpret_cast<const int64_t*>(p);
      for (int64_t k = 0; k < n / 8; ++k)
        if (v[k] < 0 || v[k] >= n_experts) {
          *what = fmt::format("expert id {}, outside [0, {})", v[k], n_experts);
          return k;
        }
      return -1;
    }
    default:  // I8: packed FP4 (E2M1) codes, every one of which is a finite value
      return -1;
  }
}

// Reads every tensor of every shard in file order and checks its values. Returns the
// problems, one line each (the first bad element of each bad tensor).
std::vector<std::string> deep_check(const Checkpoint& ck) {
  uint64_t total = 0;
  for (const auto& s : ck.shards())
    for (const TensorInfo& t : s->tensors()) total += t.bytes;
  Progress progress("inspect --deep", "MB", static_cast<int64_t>(total >> 20), 1);
  constexpr uint64_t kChunk = 64ull << 20;  // a multiple of every element size
  AlignedBuffer buffer(kChunk);
  BulkReader reader;
  std::vector<std::string> problems;
  uint64_t done = 0;
  for (const auto& shard : ck.shards()) {
    std::vector<const TensorInfo*> order;
    for (const TensorInfo& t : shard->tensors()) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (const TensorInfo* t : order) {
      const int width = std::max(1, dtype_size(t->dtype));
      for (uint64_t at = 0; at < t->bytes; at += kChunk) {
        const uint64_t n = std::min(kChunk, t->bytes - at);
        reader.read(shard->file(), buffer.data(), n, t->offset + at);
        std::string what;
        const int64_t i = first_bad_value(*t, buffer.data(), static_cast<int64_t>(n), ck.config().n_routed_experts, &what);
        done += n;
        progress.update(static_cast<int64_t>(done >> 20));
        if (i < 0) continue;
        problems.push_back(fmt::format("{}{}: tensor {} holds {} at index {}", expert_prefix(ck.config(), t->name),
                                       shard->path(), t->name, what, int64_t(at / width) + i));
        break;  // one line per tensor
      }
    }
  }
  progress.finish();
  return problems;
}

// The byte layout: every shard's tensor order (one name when they agree) and the experts' ranges.
struct LayoutFound {
  std::string order;  // official | contiguous | other | mixed
  ExpertRangeCensus experts;
};

LayoutFound find_layout(const Checkpoint& ck) {
  LayoutFound f;
  f.order = checkpoint_tensor_order(ck);
  f.experts = census_expert_ranges(ck);
  return f;
}

std::string describe_layout(const LayoutFound& f) {
  std::string order = f.order;
  if (f.order == "official") order += " (each shard's tensors grouped by dtype, sorted by name)";
  if (f.order == "contiguous") order += " (module order, each weight beside its scale)";
  if (f.order == "mixed") order += " (shards in different orders)";
  std::string ranges;
  for (const auto& [n, experts] : f.experts.experts_by_ranges)
    ranges += fmt::format("{}{} range{} per expert ({} expert{})", ranges.empty() ? "" : ", ", n, n == 1 ? "" : "s",
                          experts, experts == 1 ? "" : "s");
  return fmt::format("{}; {}; {} {} two shards", order, ranges, f.experts.straddling,
                     f.experts.straddling == 1 ? "expert straddles" : "experts straddle");
}

}  // namespace

int inspect(const InspectOptions& o) {
  Checkpoint ck = Checkpoint::open(o.dir, o.mirrors);
  const ModelConfig& c = ck.config();

  uint64_t dense_bytes = 0, expert_bytes = 0, mtp_bytes = 0, unused_bytes = 0;
  const std::set<std::string> unused(ck.unused_tensors().begin(), ck.unused_tensors().end());
  for (const auto& [name, ref] : ck.tensors()) {
    if (unused.count(name)) {
      unused_bytes += ref.info->bytes;
    } else if (name.rfind("mtp.", 0) == 0) {
      mtp_bytes += ref.info->bytes;
    } else if (is_routed_expert_tensor(name)) {
      expert_bytes += ref.info->bytes;
    } else {
      dense_bytes += ref.info->bytes;
    }
  }
  const std::string e0 = layer_prefix(c, 0) + "ffn.experts.0.";
  uint64_t bytes_per_expert = 0;
  for (const char* w : {"w1", "w2", "w3"})
    for (const char* part : {".weight", ".scale"}) bytes_per_expert += ck.get(e0 + w + part).info->bytes;

  if (o.json) {
    nlohmann::json j;
    j["dir"] = ck.dir();
    j["config"] = {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"num_hidden_layers", c.num_layers},
                   {"num_attention_heads", c.num_heads}, {"head_dim", c.head_dim}, {"qk_rope_head_dim", c.rope_dim},
                   {"q_lora_rank", c.q_lora_rank}, {"o_groups", c.o_groups}, {"o_lora_rank", c.o_lora_rank},
                   {"n_routed_experts", c.n_routed_experts}, {"num_experts_per_tok", c.n_experts_per_token},
                   {"moe_intermediate_size", c.moe_intermediate}, {"num_hash_layers", c.num_hash_layers},
                   {"sliding_window", c.sliding_window}, {"index_topk", c.index_topk},
                   {"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim},
                   {"hc_mult", c.hc_mult}, {"num_nextn_predict_layers", c.num_mtp_layers},
                   {"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id}};
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerSpec& l : c.layers) {
      layers.push_back({{"layer", l.index}, {"name", layer_prefix(c, l.index)}, {"attention", attention_kind_name(l.kind)},
                        {"compress_ratio", l.compress_ratio}, {"routing", l.hash_routed ? "hash" : "topk"},
                        {"mtp", l.is_mtp}});
    }
    j["layers"] = layers;
    j["tensor_count"] = ck.tensors().size();
    j["dense_bytes"] = dense_bytes;
    j["routed_expert_bytes"] = expert_bytes;
    j["mtp_bytes"] = mtp_bytes;
    j["bytes_per_expert"] = bytes_per_expert;
    j["mtp"] = ck.has_mtp();
    j["mtp_problems"] = ck.mtp_problems();
    j["unused_tensors"] = ck.unused_tensors();
    j["unused_bytes"] = unused_bytes;
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& s : ck.shards()) shards.push_back({{"path", s->path()}, {"bytes", s->size()}, {"tensors", s->tensors().size()}});
    j["shards"] = shards;
    const LayoutFound layout = find_layout(ck);
    nlohmann::json by_ranges = nlohmann::json::object();
    for (const auto& [n, experts] : layout.experts.experts_by_ranges) by_ranges[std::to_string(n)] = experts;
    j["layout"] = {{"tensor_order", layout.order},
                   {"experts_by_ranges", by_ranges},
                   {"straddling_experts", layout.experts.straddling}};
    int code = 0;
    if (o.deep) {
      const std::vector<std::string> problems = deep_check(ck);
      j["value_problems"] = problems;
      code = problems.empty() ? 0 : 1;
    }
    std::puts(j.dump(2).c_str());
    return code;
  }

  fmt::print("checkpoint  {}\n", ck.dir());
  fmt::print("model       DeepSeek V4: hidden {}, {} layers, {} heads x {} (rope {}), q_lora {}, o_groups {} x {}\n",
             c.hidden_size, c.num_layers, c.num_heads, c.head_dim, c.rope_dim, c.q_lora_rank, c.o_groups, c.o_lora_rank);
  fmt::print("moe         {} routed experts (top-{}) + {} shared, intermediate {}, {} hash layers\n",
             c.n_routed_experts, c.n_experts_per_token, c.n_shared_experts, c.moe_intermediate, c.num_hash_layers);
  fmt::print("attention   sliding window {}, indexer {} heads x {} top-{}, mHC {} streams\n", c.sliding_window,
             c.index_n_heads, c.index_head_dim, c.index_topk, c.hc_mult);
  fmt::print("vocab       {} (bos {}, eos {})\n", c.vocab_size, c.bos_token_id, c.eos_token_id);
  fmt::print("schedule\n");
  for (const LayerSpec& l : c.layers) {
    std::string attn = attention_kind_name(l.kind);
    if (l.kind != AttentionKind::kSliding) attn += fmt::format(" ratio {}", l.compress_ratio);
    fmt::print("  {:<10} {:<14} {}\n", l.is_mtp ? layer_prefix(c, l.index).substr(0, 5) : fmt::format("layer {}", l.index),
               attn, l.hash_routed ? "hash (tid2eid)" : "top-k + bias");
  }
  fmt::print("tensors     {}\n", ck.tensors().size());
  fmt::print("dense       {} ({} bytes)\n", human(dense_bytes), dense_bytes);
  fmt::print("experts     {} ({} bytes), {} per expert\n", human(expert_bytes), expert_bytes, human(bytes_per_expert));
  if (ck.has_mtp())
    fmt::print("mtp         yes, mtp.0 drafts ({}){}\n", human(mtp_bytes),
               c.num_mtp_layers > 1 ? fmt::format("; {} more MTP layer(s) unused", c.num_mtp_layers - 1) : "");
  else if (!ck.mtp_problems().empty())
    fmt::print("mtp         unusable (the target model loads without it): {}{}\n", ck.mtp_problems()[0],
               ck.mtp_problems().size() > 1 ? fmt::format(" (and {} more)", ck.mtp_problems().size() - 1) : "");
  else
    fmt::print("mtp         no\n");
  if (!unused.empty()) {
    // Grouped by prefix (mtp.1.*, mtp.0.markov_w1, ...): what a drafter revision adds.
    std::map<std::string, int> groups;
    for (const std::string& name : ck.unused_tensors()) {
      const size_t dot = name.find('.', 4);
      const std::string layer = dot == std::string::npos ? name : name.substr(0, dot);
      const bool in_drafter = ck.has_mtp() && layer == "mtp.0";
      ++groups[in_drafter ? name : layer + ".*"];
    }
    std::string list;
    for (const auto& [g, n] : groups) list += (list.empty() ? "" : ", ") + g;
    fmt::print("unused      {} tensors ({}) not loaded: {}\n", unused.size(), human(unused_bytes), list);
  }
  fmt::print("layout      {}\n", describe_layout(find_layout(ck)));
  fmt::print("shards      {}\n", ck.shards().size());
  for (const auto& s : ck.shards()) fmt::print("  {} ({} tensors, {})\n", s->path(), s->tensors().size(), human(s->size()));
  if (!o.deep) return 0;
  std::fflush(stdout);
  const std::vector<std::string> problems = deep_check(ck);
  if (problems.empty()) {
    fmt::print("values      every tensor's values checked: no NaN, infinity or out-of-range scale\n");
    return 0;
  }
  for (const std::string& p : problems) fmt::print(stderr, "dsv4: error: {}\n", p);
  fmt::print(stderr, "dsv4: error: {} tensor{} with bad values\n", problems.size(), problems.size() == 1 ? "" : "s");
  return 1;
}

}  // namespace dsv4::cli
