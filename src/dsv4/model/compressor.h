// KV compression (CSA and HCA) and the lightning indexer.
//
// Compressor, per token: kv = wkv·x, gate = wgate·x + ape[pos mod m]. When a window of m
// tokens is complete it emits one entry: a per-channel softmax(gate)-weighted sum of kv,
// then RMSNorm (compressor.norm) and RoPE at the window's first position (m·w).
//   HCA: the window's own m tokens.
//   CSA (overlap): 2m slots = the A half (features [0, dim)) of window w-1 followed by the
//   B half (features [dim, 2·dim)) of window w; window 0 has no A slots.
// An entry w is visible to the query at position t iff w < (t+1) / m, i.e. iff its window
// is complete by t — which is exactly "emitted before attention runs for t".
//
// Lightning indexer (CSA layers): qI = wq_b·qr per head (RoPE at t), head weights
// ω = weights_proj·x / sqrt(IH); score(t, w) = sum_h ω_h · ReLU(qI_h · kI_w) / sqrt(Id);
// the top-k visible entries by score are the compressed entries the query attends to.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/io/config.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/rope.h"
#include "dsv4/model/session.h"
#include "dsv4/model/weights.h"

namespace dsv4 {

class ThreadPool;

// Feeds T tokens (normalized sub-block input x [T, D] at positions pos0..pos0+T-1) through
// a compressor, appending every entry whose window completes to state->entries.
void compress_tokens(const ModelConfig& c, const CompressorWeights& w, const Rope& rope, const float* x, int64_t T,
                     int64_t pos0, ThreadPool* pool, CompressorState* state);

// For each of the T queries, the indices of the compressed entries it attends to
// (sorted ascending), chosen by the lightning indexer among the visible ones.
std::vector<std::vector<int32_t>> index_select(const ModelConfig& c, const IndexerWeights& w, const Rope& rope,
                                               const float* x, const float* qr, int64_t T, int64_t pos0,
                                               const CompressorState& keys, kernels::Numerics numerics,
                                               ThreadPool* pool);

}  // namespace dsv4
