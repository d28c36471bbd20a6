// Synthetic checkpoints in the official hub format (config.json, generation_config.json,
// model.safetensors.index.json + shards), so the engine can be measured at real scale
// without the 160 GB download, and a small deterministic demo model with a tokenizer.
//
// Defaults are V4 Flash's real per-layer geometry; only the layer count (and optionally
// the expert count and a few widths) shrink. Codes and scales are random but valid: FP8
// codes never NaN, E8M0 scales sized so every linear keeps unit-RMS activations unit-RMS,
// which keeps the forward pass finite and sane through any number of layers.
// The same options (seed included) give byte-identical files; a tensor's bytes depend on its
// name and the seed only, so both layouts hold the same tensors with the same bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsv4/io/tensor_order.h"

namespace dsv4 {

// Whose geometry and layer schedule: V4 Flash (the default) or V4 Pro (hidden 7168, 128 heads,
// 384 experts x 3072, index_topk 1024, routed_scaling_factor 2.5, HCA-led schedule).
enum class SynthPreset : uint8_t { kFlash, kPro };

// Routing that looks real (--routing-skew real): the router's weights, not a trace, make the
// skew. A few hidden channels (one per "topic") are reserved: the embedding writes a token's
// topic into its channel, no layer writes to those channels (rows of attn.wo_b, shared and
// routed w2 are zero there), so every layer's router sees the current token's topic; each
// scored layer's gate.weight pulls a per-(layer, topic) home set of experts up, gate.bias
// (e_score_correction_bias) gives a per-layer Zipf-like popularity, and head.weight pulls
// the next token towards the current topic, so greedy text stays on a topic for a while and
// then drifts. Hash layers keep their random tid2eid table (they cache far worse, as in the
// real model). Values are scale-free in hidden size; calibrated in docs/benchmarks.md.
struct RoutingSkew {
  bool on = false;
  int topics = 16;             // reserved channels 0..topics-1
  double embed_channel = 0.5;  // embedding's topic channel value / sqrt(hidden)
  double head_pull = 6.0;       // logit bonus (before the final RMS) of same-topic next tokens
  double router_pull = 1.75;    // router logit bonus of a (layer, topic) home expert
  int home_experts = 40;       // home experts per (layer, topic)
  double home_slope = 0.2;     // the j-th home expert's affinity is 1 - home_slope * j / home_experts
  double bias_spread = 0.5;    // gate.bias of the most popular expert; the least gets 0
  double bias_power = 1.0;     // popularity shape: bias = spread * (1 - rank / E) ^ power
  // The residual stream grows with depth, so the topic channel's share of a layer's normed
  // input shrinks; layer l's router pull is scaled by sqrt(1 + depth_gain * l) to keep it.
  double depth_gain = 1.0;
};

// The calibrated setting (the defaults above; docs/benchmarks.md, "Routing that looks real").
RoutingSkew real_routing_skew();

struct SynthOptions {
  std::string out;  // directory (created if missing; files in it are overwritten)
  SynthPreset preset = SynthPreset::kFlash;  // the layer schedule's proportions
  int layers = 4;
  int experts = 256;
  int experts_per_token = 6;
  int64_t hidden = 4096;
  int heads = 64;
  int head_dim = 512;
  int rope_dim = 64;
  int q_lora = 1024;
  int o_groups = 8;
  int o_lora = 1024;
  int moe_inter = 2048;
  int64_t vocab = 129280;
  int sliding_window = 128;
  int index_heads = 64;
  int index_head_dim = 128;
  int index_topk = 512;
  double routed_scaling = 1.5;
  int hash_layers = -1;  // -1: the real 3 of 43, scaled to `layers` (at least 1 when layers >= 2)
  std::vector<int> compress_ratios;  // empty: the real schedule's proportions (see synth.cc)
  int mtp_layers = 0;    // the real checkpoint has 1; its experts are never used by the forward pass
  // official: the hub's byte layout and sharding (tensor_order.h; shard_bytes unused);
  // contiguous: module order, a new shard when the next tensor would pass shard_bytes.
  TensorLayout layout = TensorLayout::kOfficial;
  uint64_t shard_bytes = 4ull << 30;
  uint64_t seed = 1;
  bool tokenizer = false;  // also write tokenizer.json + tokenizer_config.json (needs vocab >= 256 + 16 + merges)
  int bpe_merges = 0;      // with tokenizer: merges to learn (vocab = 256 + merges + 16 specials)
  RoutingSkew routing;     // off: uniform routing (every byte as before)
  bool drop_page_cache = true;  // fdatasync + FADV_DONTNEED each shard after writing it
};

// The preset's geometry (every field but `out`, `layers` and the seed).
SynthOptions synth_preset(SynthPreset preset);

// The demo model: hidden 512, 6 layers (SWA, SWA, CSA, HCA, CSA, HCA; 3 hash layers as in
// the real model), 32 experts, vocab 1024 with a byte-level BPE tokenizer. About 90 MB.
SynthOptions demo_synth_options(const std::string& out);

// Progress: called after each shard with (bytes written so far, total bytes).
using SynthProgress = std::function<void(uint64_t done, uint64_t total)>;

// Writes the checkpoint. Throws Error naming the option or file at fault.
void synthesize(const SynthOptions& o, const SynthProgress& progress = nullptr);

// The config.json text synthesize() writes for these options (for tests and planning).
std::string synth_config_json(const SynthOptions& o);

}  // namespace dsv4
