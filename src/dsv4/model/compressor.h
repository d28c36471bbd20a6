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

#include "dsv4/model/session.h"
#include "dsv4/model/weights.h"
#include "dsv4/model/workspace.h"

namespace dsv4 {

// Feeds the pass's T tokens (normalized sub-block input x [T, D]) through a compressor,
// appending every entry whose window completes to the state of the token's part:
// states[i]->*which (the main compressor or the indexer's) for part i.
void compress_tokens(const Pass& p, const CompressorWeights& w, const float* x, LayerState* const* states,
                     CompressorState LayerState::*which);

// The k (≤ n) highest of scores[0, n), equal scores taken by lower index (the documented tie
// rule), written to chosen[0, k) in ascending index order; order [n] is scratch.
void pick_top_k(const float* scores, int64_t n, int64_t k, int32_t* order, int32_t* chosen);

// For each of the T queries of layer `spec`, the compressed entries it attends to, chosen by
// the lightning indexer among the visible ones of its part's keys (states[i]->indexer):
// ws.picks [T, index_topk] (ascending) and ws.pick_count [T].
void index_select(const Pass& p, const LayerSpec& spec, const IndexerWeights& w, const float* x, const float* qr,
                  LayerState* const* states);

}  // namespace dsv4
