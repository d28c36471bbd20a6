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
// Compares the checkpoint's tensors with the expected set; one message per problem.
std::vector<std::string> schema_problems(const ModelConfig& c, const std::map<std::string, TensorRef>& tensors,
                                         const std::string& dir);

}  // namespace dsv4
