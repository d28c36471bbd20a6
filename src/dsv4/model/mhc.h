// Manifold-constrained hyper-connections (mHC). The residual stream of every token is
// hc (= 4) copies of the hidden vector, X [hc, D]. Around each sub-block (attention, MoE):
//   hc_pre:  mixes m = fn · rmsnorm(flatten(X)); pre/post gates and a Sinkhorn-normalized
//            hc x hc matrix C; the sub-block input is x = sum_j pre_j X_j.
//   hc_post: X'_k = post_k · y + sum_j C[j,k] · X_j   (sums over the FIRST index of C)
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/io/config.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/weights.h"

namespace dsv4 {

class ThreadPool;

// Per-token mixing coefficients of one sub-block.
struct HcMix {
  std::vector<float> pre;   // [T, hc]
  std::vector<float> post;  // [T, hc]
  std::vector<float> comb;  // [T, hc, hc], row-major C[j][k]
};

// X: [T, hc, D]. Computes the mixes for every token and the collapsed sub-block input
// x_out [T, D].
void hc_pre(const ModelConfig& c, const HyperConnectionWeights& w, const float* X, int64_t T, ThreadPool* pool,
            HcMix* mix, float* x_out);

// Updates X in place: X'_k = post_k·y + sum_j C[j,k]·X_j.
void hc_post(const ModelConfig& c, const HcMix& mix, const float* y, int64_t T, float* X);

// Final collapse of the streams before the output norm: x = sum_j pre_j X_j with
// pre = sigmoid(m·scale + base) + eps, m = hc_fn · rmsnorm(flatten(X)).
void hc_head(const ModelConfig& c, const Matrix& fn, const std::vector<float>& base, const std::vector<float>& scale,
             const float* X, int64_t T, ThreadPool* pool, float* x_out);

}  // namespace dsv4
