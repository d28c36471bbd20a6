// The exact set of tensors a DeepSeek V4 checkpoint must hold for a given config
// (names, dtypes, shapes; FP8 block-scale and FP4 per-32 scale shapes included).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dsv4/io/config.h"
#include "dsv4/io/safetensors.h"

namespace dsv4 {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Name prefix of a layer: "layers.7." or "mtp.0.".
std::string layer_prefix(const ModelConfig& c, int layer);

// Every tensor the model needs, in a stable order.
std::vector<TensorSpec> expected_tensors(const ModelConfig& c);

struct TensorRef;
// The checkpoint's tensors against the expected set; one message per problem.
struct SchemaReport {
  std::vector<std::string> problems;      // the model cannot load
  std::vector<std::string> mtp_problems;  // mtp.0 cannot draft (the target model still loads)
  // Drafter tensors the engine does not use: MTP layers after mtp.0 and anything else under
  // "mtp." (e.g. the DSpark stages' Markov and confidence heads), by name.
  std::vector<std::string> unused;
};
SchemaReport check_schema(const ModelConfig& c, const std::map<std::string, TensorRef>& tensors,
                          const std::string& dir);

}  // namespace dsv4
