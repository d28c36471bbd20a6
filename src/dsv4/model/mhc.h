// Manifold-constrained hyper-connections (mHC). The residual stream of every token is
// hc (= 4) copies of the hidden vector, X [hc, D]. Around each sub-block (attention, MoE):
//   hc_pre:  mixes m = fn · rmsnorm(flatten(X)); pre/post gates and a Sinkhorn-normalized
//            hc x hc matrix C; the sub-block input is x = sum_j pre_j X_j.
//   hc_post: X'_k = post_k · y + sum_j C[j,k] · X_j   (sums over the FIRST index of C)
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/model/weights.h"
#include "dsv4/model/workspace.h"

namespace dsv4 {

// The workspace's mix buffers.
HcMix workspace_mix(ForwardWorkspace& ws);

// X: [T, hc, D]. Computes every token's mixes into `mix` and the collapsed sub-block input
// x_out [T, D].
void hc_pre(const Pass& p, const HyperConnectionWeights& w, const float* X, HcMix mix, float* x_out);

// Updates X [T, hc, D] in place: X'_k = post_k·y + sum_j C[j,k]·X_j.
void hc_post(const Pass& p, HcMix mix, const float* y, float* X);

// Final collapse of the streams of `rows` tokens before the output norm: x = sum_j pre_j X_j
// with pre = sigmoid(m·scale + base) + eps, m = hc_fn · rmsnorm(flatten(X)).
void hc_head(const Pass& p, const Matrix& fn, const std::vector<float>& base, const std::vector<float>& scale,
             const float* X, int64_t rows, float* x_out);

}  // namespace dsv4
