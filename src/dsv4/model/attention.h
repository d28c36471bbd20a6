// Attention of one layer for a chunk of T tokens (spec §3.5):
//   q   = wq_b · RMSNorm(wq_a · x), per-head unweighted RMS norm, RoPE on the last dims
//   kv  = RMSNorm(wkv · x), RoPE       (one shared head: K = V)
//   each query attends to its sliding window (the last `window` positions incl. itself)
//   plus, on HCA layers, every visible compressed entry; on CSA layers, the entries the
//   lightning indexer picks. Softmax includes a per-head sink logit.
//   o = inverse RoPE(o); out = wo_b · concat_g(wo_a[g] · o_g)
#pragma once

#include <cstdint>

#include "dsv4/io/config.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/rope.h"
#include "dsv4/model/session.h"
#include "dsv4/model/weights.h"

namespace dsv4 {

class ThreadPool;

// x: [T, D] normalized sub-block input at positions pos0..; out: [T, D].
void attention(const ModelConfig& c, const LayerWeights& L, const Rope& rope, const float* x, int64_t T,
               int64_t pos0, kernels::Numerics numerics, ThreadPool* pool, LayerState* state, float* out);

}  // namespace dsv4
