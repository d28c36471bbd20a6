// Expert I/O lookahead. Before a layer's MoE runs, guess which routed experts it will use
// by running that layer's own mHC pre-mix, ffn norm and router early, on the streams as they
// are now (still missing the sub-blocks in between), and hand the guess to the provider so
// their reads overlap the compute in between. Hash-routed layers are exact: tid2eid only
// depends on the token ids. The guess never changes results, only what is read when.
#pragma once

#include <cstdint>
#include <span>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/io/config.h"
#include "dsv4/model/weights.h"

namespace dsv4 {

class ThreadPool;

// X: [T, hc, D] streams. Calls experts.predict(layer.spec.index, union of guessed experts).
void predict_layer_experts(const ModelConfig& c, const LayerWeights& layer, const float* X,
                           std::span<const int32_t> tokens, ThreadPool* pool, ExpertProvider& experts);

}  // namespace dsv4
