// Mixture of experts (spec §3.8):
//   router: s = sqrt(softplus(gate·x)); experts = tid2eid[token] on hash layers, else
//   top-k of (s + bias) (the bias only selects); weights = s[e] / sum s[chosen] · route_scale.
//   each expert: a = silu(min(w1·x, L)) · clamp(w3·x, -L, L); y_e = w2·a
//   y = sum_e weight_e · y_e (ascending expert id) + shared_expert(x)
// The pass is expert-major: every expert its tokens need is fetched once and applied to all
// the pass's tokens routed to it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/model/weights.h"
#include "dsv4/model/workspace.h"

namespace dsv4 {

// The router's score of each expert: score[e] = sqrt(softplus(logits[e])), e < E.
void router_scores(const float* logits, int E, float* score);
// The `width` experts with the largest score + bias, best first (ties: the lower id), into
// out[width]: top-k routing's choice, and the order the lookahead guesses in. `biased` [E]
// and `order` [E] are scratch.
void top_biased_experts(const float* score, const std::vector<float>& bias, int width, float* biased,
                        int32_t* order, int32_t* out);

// Routes the pass's tokens: ws.route_experts / ws.route_weights [T, K].
void route(const Pass& p, const MoeWeights& w, const float* x, std::span<const int32_t> tokens, bool hash_routed);

// x: [T, D] normalized sub-block input; out: [T, D].
void moe(const Pass& p, const LayerWeights& L, const float* x, std::span<const int32_t> tokens,
         ExpertProvider& experts, float* out);

}  // namespace dsv4
