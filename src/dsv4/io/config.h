// The hub config.json of a DeepSeek V4 checkpoint, parsed strictly and validated, plus the
// per-layer schedule derived exactly as the official inference code does:
//   compress_ratio 0 -> sliding window only; 4 -> CSA (overlapping compressor + indexer);
//   any other non-zero ratio -> HCA; layers < num_hash_layers route by tid2eid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

enum class AttentionKind : uint8_t { kSliding, kCSA, kHCA };
const char* attention_kind_name(AttentionKind k);  // "SWA", "CSA", "HCA"

struct LayerSpec {
  int index = 0;            // 0..num_layers-1; MTP layers continue the numbering
  int compress_ratio = 0;   // 0, 4 (CSA) or another ratio (HCA)
  AttentionKind kind = AttentionKind::kSliding;
  bool hash_routed = false; // tid2eid routing (no gate.bias)
  bool is_mtp = false;
};

struct YarnConfig {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  std::string source;  // path of config.json, for messages

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int head_dim = 0;
  int rope_dim = 0;  // qk_rope_head_dim: RoPE on the trailing rope_dim dims
  int q_lora_rank = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int n_routed_experts = 0;
  int n_experts_per_token = 0;
  int n_shared_experts = 0;
  int moe_intermediate = 0;
  int num_hash_layers = 0;
  int sliding_window = 0;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  int num_mtp_layers = 0;
  int64_t max_position_embeddings = 0;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  double rms_norm_eps = 1e-6;
  double hc_eps = 1e-6;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;  // 0 = no clamp
  YarnConfig yarn;

  std::vector<int> compress_ratios;  // num_layers (+ num_mtp_layers) entries
  std::vector<LayerSpec> layers;     // main layers, then MTP layers

  // Parses and validates; throws Error naming the file and the field.
  static ModelConfig from_json(const std::string& json_text, const std::string& source);
  static ModelConfig load(const std::string& path);

  int n_main_layers() const { return num_layers; }
  const LayerSpec& layer(int i) const { return layers[static_cast<size_t>(i)]; }
};

}  // namespace dsv4
