// Expert I/O lookahead. At the start of a layer, before its attention, guess which routed
// experts its MoE will use by running the layer's own mHC pre-mix, ffn norm and router on
// the streams as they are now (still missing the attention's contribution), and hand the
// guess to the provider so the reads overlap the attention. Hash-routed layers are exact:
// tid2eid only depends on the token ids. The guess never changes results, only what is read
// when.
//
// Why there: the attention is most of a layer's compute, and it moves the router's input
// little. On the 4-layer synthetic checkpoint, the top 6 guessed at the layer start hold
// 85 % of the experts the MoE then uses, the top 12 98 %; guessed one sub-block earlier
// (after the previous layer's attention, before its MoE) the top 6 hold only ~50 %.
#pragma once

#include <cstdint>
#include <span>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/io/config.h"
#include "dsv4/model/weights.h"

namespace dsv4 {

class ThreadPool;

// X: [T, hc, D] streams. Calls experts.predict(layer.spec.index, guess), most likely first.
void predict_layer_experts(const ModelConfig& c, const LayerWeights& layer, const float* X,
                           std::span<const int32_t> tokens, ThreadPool* pool, ExpertProvider& experts);

}  // namespace dsv4
