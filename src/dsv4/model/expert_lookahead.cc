#include "dsv4/model/expert_lookahead.h"

#include <vector>

#include "dsv4/model/mhc.h"
#include "dsv4/model/moe.h"
#include "dsv4/model/ops.h"

namespace dsv4 {

void predict_layer_experts(const ModelConfig& c, const LayerWeights& layer, const float* X,
                           std::span<const int32_t> tokens, ThreadPool* pool, ExpertProvider& experts) {
  const int64_t T = static_cast<int64_t>(tokens.size()), D = c.hidden_size;
  std::vector<char> used(static_cast<size_t>(c.n_routed_experts), 0);
  auto tell = [&] {  // the union over the chunk, in ascending expert id (the order moe() acquires them)
    std::vector<int> guess;
    for (int e = 0; e < c.n_routed_experts; ++e)
      if (used[e]) guess.push_back(e);
    experts.predict(layer.spec.index, guess);
  };
  if (layer.spec.hash_routed) {  // exact: the experts follow from the token ids alone
    const int K = c.n_experts_per_token;
    for (int32_t t : tokens)
      for (int k = 0; k < K; ++k) used[layer.moe.tid2eid[static_cast<size_t>(t) * K + k]] = 1;
    tell();
    return;
  }
  std::vector<float> x(static_cast<size_t>(T * D));
  HcMix mix;
  hc_pre(c, layer.hc_ffn, X, T, pool, &mix, x.data());
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t t = 0; t < T; ++t) ops::rms_norm(x.data() + t * D, layer.ffn_norm.data(), D, eps, x.data() + t * D);
  const Routing r = route(c, layer.moe, x.data(), tokens, layer.spec.hash_routed, pool);
  for (int32_t e : r.experts) used[e] = 1;
  tell();
}

}  // namespace dsv4
