// Attention of one layer for the T tokens of a pass (spec §3.5):
//   q   = wq_b · RMSNorm(wq_a · x), per-head unweighted RMS norm, RoPE on the last dims
//   kv  = RMSNorm(wkv · x), RoPE       (one shared head: K = V)
//   each query attends to its sliding window (the last `window` positions incl. itself)
//   plus, on HCA layers, every visible compressed entry; on CSA layers, the entries the
//   lightning indexer picks. Softmax includes a per-head sink logit.
//   o = inverse RoPE(o); out = wo_b · concat_g(wo_a[g] · o_g)
#pragma once

#include "dsv4/model/session.h"
#include "dsv4/model/weights.h"
#include "dsv4/model/workspace.h"

namespace dsv4 {

// x: [T, D] normalized sub-block input of the pass's rows; out: [T, D]. states[i]: this
// layer's state of the pass's part i (p.n_parts() of them). The projections run once over
// all rows; the window, the compressors' state and the attention itself run per part.
void attention(const Pass& p, const LayerWeights& L, const float* x, LayerState* const* states, float* out);

}  // namespace dsv4
