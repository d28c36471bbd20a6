#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/cli/commands.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/io/schema.h"

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

}  // namespace

int inspect(const InspectOptions& o) {
  Checkpoint ck = Checkpoint::open(o.dir);
  const ModelConfig& c = ck.config();

  uint64_t dense_bytes = 0, expert_bytes = 0, mtp_bytes = 0;
  for (const auto& [name, ref] : ck.tensors()) {
    if (name.rfind("mtp.", 0) == 0) {
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
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& s : ck.shards()) shards.push_back({{"path", s->path()}, {"bytes", s->size()}, {"tensors", s->tensors().size()}});
    j["shards"] = shards;
    std::puts(j.dump(2).c_str());
    return 0;
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
  fmt::print("mtp         {}\n", ck.has_mtp() ? fmt::format("yes, {} layer(s), {}", c.num_mtp_layers, human(mtp_bytes)) : "no");
  fmt::print("shards      {}\n", ck.shards().size());
  for (const auto& s : ck.shards()) fmt::print("  {} ({} tensors, {})\n", s->path(), s->tensors().size(), human(s->size()));
  return 0;
}

}  // namespace dsv4::cli
