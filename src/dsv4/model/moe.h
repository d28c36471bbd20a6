// Mixture of experts (spec §3.8):
//   router: s = sqrt(softplus(gate·x)); experts = tid2eid[token] on hash layers, else
//   top-k of (s + bias) (the bias only selects); weights = s[e] / sum s[chosen] · route_scale.
//   each expert: a = silu(min(w1·x, L)) · clamp(w3·x, -L, L); y_e = w2·a
//   y = sum_e weight_e · y_e (ascending expert id) + shared_expert(x)
// Prefill is expert-major: every expert needed by the chunk is fetched once and applied to
// all the chunk's tokens routed to it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/io/config.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/weights.h"

namespace dsv4 {

class ThreadPool;

struct Routing {
  std::vector<int32_t> experts;  // [T, K]
  std::vector<float> weights;    // [T, K]
};

Routing route(const ModelConfig& c, const MoeWeights& w, const float* x, std::span<const int32_t> tokens,
              bool hash_routed, ThreadPool* pool);

// The router's score of each expert: score[e] = sqrt(softplus(logits[e])), e < E.
void router_scores(const float* logits, int E, float* score);
// The `width` experts with the largest score + bias, best first (ties: the lower id): top-k
// routing's choice, and the order the lookahead guesses in.
std::vector<int32_t> top_biased_experts(const float* score, const std::vector<float>& bias, int width);

// x: [T, D] normalized sub-block input; out: [T, D].
void moe(const ModelConfig& c, const LayerWeights& L, const float* x, std::span<const int32_t> tokens,
         kernels::Numerics numerics, ThreadPool* pool, ExpertProvider& experts, float* out);

}  // namespace dsv4
