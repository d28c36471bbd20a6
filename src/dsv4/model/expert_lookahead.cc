#include "dsv4/model/expert_lookahead.h"

#include <algorithm>

#include "dsv4/kernels/kernels.h"
#include "dsv4/model/mhc.h"
#include "dsv4/model/moe.h"
#include "dsv4/model/ops.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4 {
namespace {

// The union of each token's `width` best experts (ranked [T, width]), in rank order: every
// token's first choice, then every token's second, ... (ascending id within a rank). Returns
// the guess's length; the guess is in ws.guess, and *first_ranks its length after the first
// `ranks` ranks.
int union_by_rank(ForwardWorkspace& ws, int64_t T, int n_experts, int width, int ranks = 0, int* first_ranks = nullptr) {
  char* taken = ws.guessed.data();
  std::fill(taken, taken + n_experts, 0);
  int32_t* guess = ws.guess.data();
  int n = 0;
  for (int rank = 0; rank < width; ++rank) {
    const int rank_begin = n;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t e = ws.ranked[t * width + rank];
      if (!taken[e]) {
        taken[e] = 1;
        guess[n++] = e;
      }
    }
    std::sort(guess + rank_begin, guess + n);
    if (rank + 1 == ranks && first_ranks) *first_ranks = n;
  }
  return n;
}

}  // namespace

std::span<const int> hash_layer_experts(ForwardWorkspace& ws, const ModelConfig& c, const LayerWeights& layer,
                                       std::span<const int32_t> tokens) {
  const int K = c.n_experts_per_token;
  const int64_t T = static_cast<int64_t>(tokens.size());
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(layer.moe.tid2eid.data() + static_cast<size_t>(tokens[t]) * K, K, ws.ranked.data() + t * K);
  const int n = union_by_rank(ws, T, c.n_routed_experts, K);
  return std::span<const int>(ws.guess.data(), static_cast<size_t>(n));
}

int predict_layer_experts(const Pass& p, const LayerWeights& layer, const float* X, std::span<const int32_t> tokens,
                          ExpertProvider& experts, bool hash_as_certain, int64_t room) {
  ForwardWorkspace& ws = p.ws;
  const int64_t T = p.T, D = p.c.hidden_size;
  const int E = p.c.n_routed_experts, K = p.c.n_experts_per_token;
  auto cut = [&](std::span<const int> list) {
    return room >= 0 && static_cast<int64_t>(list.size()) > room ? list.first(static_cast<size_t>(room)) : list;
  };
  int width = K;
  if (layer.spec.hash_routed) {  // exact: the experts follow from the token ids alone
    const std::span<const int> list = hash_layer_experts(ws, p.c, layer, tokens);
    if (hash_as_certain) {
      experts.expect(layer.spec.index, cut(list));
    } else {
      experts.predict(layer.spec.index, cut(list));
    }
    return static_cast<int>(list.size());
  } else {
    // The router as moe() runs it, ranked as top-k routing ranks.
    float* x = ws.x.data();
    hc_pre(p, layer.hc_ffn, X, workspace_mix(ws), x);
    ops::rms_norm_rows(x, layer.ffn_norm.data(), T, D, static_cast<float>(p.c.rms_norm_eps), x);
    float* logits = ws.router_logits.data();
    kernels::matmul(layer.moe.gate, x, T, logits, kernels::Numerics::kReference, &p.pool);
    // One token (decode) guesses twice its top-k: the SSD can read several experts in the
    // time of one token's dense compute, and ranks 7-12 hold most of what the top 6 miss.
    // A prefill chunk's union of top-k already spans much of the layer.
    width = std::min(E, T == 1 ? 2 * K : K);
    for (int64_t t = 0; t < T; ++t) {
      router_scores(logits + t * E, E, ws.router_score.data());
      top_biased_experts(ws.router_score.data(), layer.moe.bias, width, ws.router_biased.data(),
                         ws.router_order.data(), ws.ranked.data() + t * width);
    }
  }
  int top_k = 0;
  const int n = union_by_rank(ws, T, E, width, std::min(K, width), &top_k);
  experts.predict(layer.spec.index, cut(std::span<const int>(ws.guess.data(), static_cast<size_t>(n))));
  return top_k;
}

}  // namespace dsv4
