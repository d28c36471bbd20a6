#include "dsv4/io/config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4 {
namespace {

using Json = nlohmann::json;

class Reader {
 public:
  Reader(const Json& j, const std::string& source) : j_(j), source_(source) {}

  const Json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t integer(const char* key, int64_t lo, int64_t hi, const int64_t* fallback = nullptr) const {
    const Json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail("{}: field {} is missing", source_, key);
    }
    if (!v->is_number_integer()) fail("{}: field {} must be an integer, got {}", source_, key, v->dump());
    int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
    if (x < lo || x > hi) fail("{}: field {} = {} is outside [{}, {}]", source_, key, x, lo, hi);
    return x;
  }

  int64_t integer_or(const char* key, int64_t lo, int64_t hi, int64_t fallback) const {
    return integer(key, lo, hi, &fallback);
  }

  double number(const char* key, double lo, double hi, const double* fallback = nullptr) const {
    const Json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail("{}: field {} is missing", source_, key);
    }
    if (!v->is_number()) fail("{}: field {} must be a number, got {}", source_, key, v->dump());
    double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) fail("{}: field {} = {} is outside [{}, {}]", source_, key, v->dump(), lo, hi);
    return x;
  }

  double number_or(const char* key, double lo, double hi, double fallback) const {
    return number(key, lo, hi, &fallback);
  }

  std::string string_or(const char* key, const std::string& fallback) const {
    const Json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail("{}: field {} must be a string, got {}", source_, key, v->dump());
    return v->get<std::string>();
  }

 private:
  const Json& j_;
  const std::string& source_;
};

}  // namespace

const char* attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kSliding: return "SWA";
    case AttentionKind::kCSA: return "CSA";
    case AttentionKind::kHCA: return "HCA";
  }
  return "?";
}

ModelConfig ModelConfig::from_json(const std::string& json_text, const std::string& source) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("{}: not valid JSON", source);
  if (!j.is_object()) fail("{}: top level must be a JSON object", source);
  Reader r(j, source);
  ModelConfig c;
  c.source = source;

  std::string model_type = r.string_or("model_type", "deepseek_v4");
  if (model_type != "deepseek_v4") fail("{}: field model_type = \"{}\", expected \"deepseek_v4\"", source, model_type);
  if (r.string_or("scoring_func", "sqrtsoftplus") != "sqrtsoftplus")
    fail("{}: field scoring_func must be \"sqrtsoftplus\"", source);
  if (r.string_or("hidden_act", "silu") != "silu") fail("{}: field hidden_act must be \"silu\"", source);
  std::string expert_dtype = r.string_or("expert_dtype", "fp4");
  if (expert_dtype != "fp4")
    fail("{}: field expert_dtype = \"{}\" is not supported (only the fp4 experts of the released checkpoints)",
         source, expert_dtype);

  c.vocab_size = r.integer("vocab_size", 1, 16'000'000);
  c.hidden_size = r.integer("hidden_size", 1, 65536);
  c.num_layers = static_cast<int>(r.integer("num_hidden_layers", 1, 1024));
  c.num_heads = static_cast<int>(r.integer("num_attention_heads", 1, 1024));
  if (r.integer_or("num_key_value_heads", 1, 1024, 1) != 1)
    fail("{}: field num_key_value_heads must be 1 (shared-KV attention)", source);
  c.head_dim = static_cast<int>(r.integer("head_dim", 2, 4096));
  c.rope_dim = static_cast<int>(r.integer("qk_rope_head_dim", 2, 4096));
  c.q_lora_rank = static_cast<int>(r.integer("q_lora_rank", 1, 65536));
  c.o_groups = static_cast<int>(r.integer("o_groups", 1, 1024));
  c.o_lora_rank = static_cast<int>(r.integer("o_lora_rank", 1, 65536));
  c.n_routed_experts = static_cast<int>(r.integer("n_routed_experts", 1, 4096));
  c.n_experts_per_token = static_cast<int>(r.integer("num_experts_per_tok", 1, 4096));
  c.n_shared_experts = static_cast<int>(r.integer_or("n_shared_experts", 1, 1, 1));
  c.moe_intermediate = static_cast<int>(r.integer("moe_intermediate_size", 1, 65536));
  c.num_hash_layers = static_cast<int>(r.integer_or("num_hash_layers", 0, 1024, 0));
  c.sliding_window = static_cast<int>(r.integer("sliding_window", 1, 1 << 20));
  c.index_n_heads = static_cast<int>(r.integer("index_n_heads", 1, 1024));
  c.index_head_dim = static_cast<int>(r.integer("index_head_dim", 2, 4096));
  c.index_topk = static_cast<int>(r.integer("index_topk", 1, 1 << 20));
  c.hc_mult = static_cast<int>(r.integer("hc_mult", 1, 64));
  c.hc_sinkhorn_iters = static_cast<int>(r.integer("hc_sinkhorn_iters", 1, 1000));
  c.num_mtp_layers = static_cast<int>(r.integer_or("num_nextn_predict_layers", 0, 16, 0));
  c.max_position_embeddings = r.integer("max_position_embeddings", 1, int64_t{1} << 40);
  c.bos_token_id = r.integer("bos_token_id", 0, c.vocab_size - 1);
  c.eos_token_id = r.integer("eos_token_id", 0, c.vocab_size - 1);

  c.rms_norm_eps = r.number("rms_norm_eps", 1e-30, 1.0);
  c.hc_eps = r.number("hc_eps", 0.0, 1.0);
  c.rope_theta = r.number("rope_theta", 1.0, 1e12);
  c.compress_rope_theta = r.number_or("compress_rope_theta", 1.0, 1e12, c.rope_theta);
  c.routed_scaling_factor = r.number("routed_scaling_factor", 1e-6, 1e6);
  c.swiglu_limit = r.number_or("swiglu_limit", 0.0, 1e9, 0.0);

  if (const Json* q = r.find("quantization_config")) {
    if (!q->is_object()) fail("{}: field quantization_config must be an object", source);
    Reader qr(*q, source);
    if (qr.string_or("fmt", "e4m3") != "e4m3") fail("{}: field quantization_config.fmt must be \"e4m3\"", source);
    if (qr.string_or("scale_fmt", "ue8m0") != "ue8m0")
      fail("{}: field quantization_config.scale_fmt must be \"ue8m0\"", source);
    if (const Json* b = qr.find("weight_block_size")) {
      if (*b != Json::array({128, 128})) fail("{}: field quantization_config.weight_block_size must be [128, 128]", source);
    }
  }

  if (const Json* rs = r.find("rope_scaling")) {
    if (!rs->is_object()) fail("{}: field rope_scaling must be an object", source);
    Reader yr(*rs, source);
    std::string type = yr.string_or("type", yr.string_or("rope_type", ""));
    if (type != "yarn") fail("{}: field rope_scaling.type = \"{}\" is not supported (expected \"yarn\")", source, type);
    c.yarn.enabled = true;
    c.yarn.factor = yr.number("factor", 1.0, 1e6);
    c.yarn.original_max_position = yr.integer("original_max_position_embeddings", 1, int64_t{1} << 40);
    c.yarn.beta_fast = yr.number_or("beta_fast", 1e-6, 1e6, 32.0);
    c.yarn.beta_slow = yr.number_or("beta_slow", 1e-6, 1e6, 1.0);
  }

  // Consistency between dimensions.
  if (c.rope_dim % 2 || c.rope_dim >= c.head_dim)
    fail("{}: field qk_rope_head_dim = {} must be even and smaller than head_dim {}", source, c.rope_dim, c.head_dim);
  if (c.rope_dim > c.index_head_dim)
    fail("{}: field index_head_dim = {} must be at least qk_rope_head_dim {}", source, c.index_head_dim, c.rope_dim);
  if (c.num_heads % c.o_groups)
    fail("{}: field o_groups = {} must divide num_attention_heads {}", source, c.o_groups, c.num_heads);
  if (c.n_experts_per_token > c.n_routed_experts)
    fail("{}: field num_experts_per_tok = {} exceeds n_routed_experts {}", source, c.n_experts_per_token, c.n_routed_experts);
  if (c.num_hash_layers > c.num_layers)
    fail("{}: field num_hash_layers = {} exceeds num_hidden_layers {}", source, c.num_hash_layers, c.num_layers);
  if (c.hidden_size % 2 || c.moe_intermediate % 2)
    fail("{}: hidden_size and moe_intermediate_size must be even (FP4 experts pack two values per byte)", source);
  if (int64_t(c.num_heads) * c.head_dim > (int64_t{1} << 24))
    fail("{}: num_attention_heads x head_dim is absurdly large", source);

  const Json* ratios = r.find("compress_ratios");
  if (!ratios || !ratios->is_array()) fail("{}: field compress_ratios is missing or not an array", source);
  size_t n_main = static_cast<size_t>(c.num_layers), n_all = n_main + static_cast<size_t>(c.num_mtp_layers);
  if (ratios->size() != n_main && ratios->size() != n_all)
    fail("{}: field compress_ratios has {} entries, expected num_hidden_layers ({}) or num_hidden_layers + "
         "num_nextn_predict_layers ({})", source, ratios->size(), n_main, n_all);
  for (size_t i = 0; i < ratios->size(); ++i) {
    const Json& v = (*ratios)[i];
    if (!v.is_number_integer()) fail("{}: field compress_ratios[{}] must be an integer", source, i);
    int64_t ratio = v.get<int64_t>();
    if (ratio < 0 || ratio == 1 || ratio > 65536)
      fail("{}: field compress_ratios[{}] = {} must be 0 or in [2, 65536]", source, i, ratio);
    c.compress_ratios.push_back(static_cast<int>(ratio));
  }
  // A config that lists only the main layers gives MTP layers sliding-only attention, as
  // the released checkpoints do.
  while (c.compress_ratios.size() < n_all) c.compress_ratios.push_back(0);

  for (size_t i = 0; i < n_all; ++i) {
    LayerSpec l;
    l.index = static_cast<int>(i);
    l.is_mtp = i >= n_main;
    l.compress_ratio = c.compress_ratios[i];
    l.kind = l.compress_ratio == 0 ? AttentionKind::kSliding
             : l.compress_ratio == 4 ? AttentionKind::kCSA : AttentionKind::kHCA;
    l.hash_routed = !l.is_mtp && l.index < c.num_hash_layers;
    c.layers.push_back(l);
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  return from_json(read_small_file(path, 16 << 20), path);
}

}  // namespace dsv4
