#include "dsv4/model/expert_lookahead.h"

#include <algorithm>
#include <vector>

#include "dsv4/kernels/kernels.h"
#include "dsv4/model/mhc.h"
#include "dsv4/model/moe.h"
#include "dsv4/model/ops.h"

namespace dsv4 {
namespace {

// The union of each token's `width` best experts, in rank order: every token's first
// choice, then every token's second, ... (ascending id within a rank).
std::vector<int> union_by_rank(const std::vector<std::vector<int32_t>>& ranked, int n_experts, int width) {
  std::vector<char> taken(static_cast<size_t>(n_experts), 0);
  std::vector<int> guess;
  for (int rank = 0; rank < width; ++rank) {
    std::vector<int> at_rank;
    for (const auto& r : ranked)
      if (rank < static_cast<int>(r.size()) && !taken[r[rank]]) {
        taken[r[rank]] = 1;
        at_rank.push_back(r[rank]);
      }
    std::sort(at_rank.begin(), at_rank.end());
    guess.insert(guess.end(), at_rank.begin(), at_rank.end());
  }
  return guess;
}

}  // namespace

void predict_layer_experts(const ModelConfig& c, const LayerWeights& layer, const float* X,
                           std::span<const int32_t> tokens, ThreadPool* pool, ExpertProvider& experts) {
  const int64_t T = static_cast<int64_t>(tokens.size()), D = c.hidden_size;
  const int E = c.n_routed_experts, K = c.n_experts_per_token;
  std::vector<std::vector<int32_t>> ranked(static_cast<size_t>(T));
  if (layer.spec.hash_routed) {  // exact: the experts follow from the token ids alone
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* row = layer.moe.tid2eid.data() + static_cast<size_t>(tokens[t]) * K;
      ranked[t].assign(row, row + K);
    }
    experts.predict(layer.spec.index, union_by_rank(ranked, E, K));
    return;
  }
  // The router as moe() runs it, ranked as top-k routing ranks.
  std::vector<float> x(static_cast<size_t>(T * D)), logits(static_cast<size_t>(T * E)), score(static_cast<size_t>(E));
  HcMix mix;
  hc_pre(c, layer.hc_ffn, X, T, pool, &mix, x.data());
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t t = 0; t < T; ++t) ops::rms_norm(x.data() + t * D, layer.ffn_norm.data(), D, eps, x.data() + t * D);
  kernels::matmul(layer.moe.gate, x.data(), T, logits.data(), kernels::Numerics::kReference, pool);
  // One token (decode) guesses twice its top-k: the SSD can read several experts in the
  // time of one token's dense compute, and ranks 7-12 hold most of what the top 6 miss.
  // A prefill chunk's union of top-k already spans much of the layer.
  const int width = std::min(E, T == 1 ? 2 * K : K);
  for (int64_t t = 0; t < T; ++t) {
    router_scores(logits.data() + t * E, E, score.data());
    ranked[t] = top_biased_experts(score.data(), layer.moe.bias, width);
  }
  experts.predict(layer.spec.index, union_by_rank(ranked, E, width));
}

}  // namespace dsv4
