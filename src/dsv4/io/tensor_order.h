// The two byte layouts a checkpoint's shards can have, and the official index's sharding.
//
// official    what the hub's files hold: the safetensors library writes each shard's tensors
//             grouped by dtype and sorted by name (the rule is in tensor_order.cc), so a routed
//             expert's three FP4 weights are one run of the shard and its three E8M0 scales
//             another (the scales of a whole layer are one run); one shard per layer.
// contiguous  module order, each weight next to its scale (what dsv4 synth wrote before): an
//             expert is one run. Only for comparison; no released checkpoint looks like this.
#pragma once

#include <string>
#include <vector>

#include "dsv4/io/safetensors_writer.h"

namespace dsv4 {

struct ModelConfig;
class Checkpoint;
class SafetensorsFile;

enum class TensorLayout : uint8_t { kOfficial, kContiguous };

// "official" or "contiguous"; throws Error naming --layout otherwise.
TensorLayout parse_tensor_layout(const std::string& text);
const char* tensor_layout_name(TensorLayout layout);

// Sorts one shard's tensors into the order the safetensors library writes them.
void sort_safetensors_order(std::vector<TensorDecl>& tensors);
// Whether `a` comes before `b` in that order.
bool safetensors_before(DType a_dtype, const std::string& a_name, DType b_dtype, const std::string& b_name);

// Module order: the schema's (expected_tensors), tensors the schema does not know after, by name.
void sort_module_order(std::vector<TensorDecl>& tensors, const ModelConfig& c);

// The order a shard's tensors are in, by offset: "official", "contiguous", or "other" (neither).
const char* shard_tensor_order(const SafetensorsFile& shard, const ModelConfig& c);
// The checkpoint's: its shards' order when they all agree, else "mixed".
std::string checkpoint_tensor_order(const Checkpoint& ck);

// The official index's shard of a tensor, 0-based, for a model of `num_layers` main layers:
// layers.L.* in shard L + 1 and each MTP layer (mtp.i.*) in a shard of its own at the end, as
// on the hub (V4 Flash: layer 0 in model-00002-of-00046, mtp.0 alone in model-00046-of-00046);
// embed.weight first and head.weight, norm.weight, hc_head_* after the layers (where the hub
// puts those few is not recorded here). Flash: 1 + 43 + 1 + 1 = 46 shards, no expert split.
int official_shard_of(const std::string& name, int num_layers);

}  // namespace dsv4
