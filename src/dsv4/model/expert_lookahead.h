// Expert I/O lookahead. Before a layer's MoE runs, guess which routed experts it will use
// by running the layer's own mHC pre-mix, ffn norm and router on the streams as they are
// now, and hand the guess to the provider so the reads overlap the compute in between.
// Hash-routed layers are exact: tid2eid only depends on the token ids. The guess never
// changes results, only what is read when.
//
// The engine guesses each layer twice: after the previous layer's attention (the streams
// still miss that layer's MoE and this layer's attention; the reads can run during the
// previous MoE), and at the layer's start (missing only its attention, which moves the
// router's input little). On the 4-layer synthetic checkpoint the top 6 / top 12 guessed
// at the layer start hold 85 % / 98 % of the experts the MoE then uses; guessed at the
// earlier point, ~50 % / 74 %.
#pragma once

#include <cstdint>
#include <span>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/model/weights.h"
#include "dsv4/model/workspace.h"

namespace dsv4 {

// X: [T, hc, D] streams. Calls experts.predict(layer.spec.index, guess), most likely first;
// for a hash-routed layer with `hash_as_certain`, experts.expect(...) instead (the list is
// exact, so it is read at full queue depth rather than in idle read slots). The guess is
// cut to its `room` most likely experts (-1: no cut). Returns how many experts the layer
// is guessed to use: the union of the tokens' top-k (a decode's guess goes deeper).
// Uses the workspace's x, mix and router buffers (none is live between sub-blocks).
int predict_layer_experts(const Pass& p, const LayerWeights& layer, const float* X, std::span<const int32_t> tokens,
                          ExpertProvider& experts, bool hash_as_certain, int64_t room);

// The experts a hash-routed layer uses for these tokens (at most ws.max_rows): the union, in
// rank order, held in the workspace's guess buffer until its next use.
std::span<const int> hash_layer_experts(ForwardWorkspace& ws, const ModelConfig& c, const LayerWeights& layer,
                                       std::span<const int32_t> tokens);

}  // namespace dsv4
