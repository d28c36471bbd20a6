#include "dsv4/io/schema.h"

#include <fmt/format.h>

#include "dsv4/io/checkpoint.h"

namespace dsv4 {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class SpecList {
 public:
  explicit SpecList(std::vector<TensorSpec>* out) : out_(out) {}
  void add(std::string name, DType dtype, std::vector<int64_t> shape) {
    out_->push_back({std::move(name), dtype, std::move(shape)});
  }
  // FP8 E4M3 weight [out, in] with E8M0 scales on a 128x128 grid.
  void fp8(const std::string& base, int64_t out, int64_t in) {
    add(base + ".weight", DType::kF8_E4M3, {out, in});
    add(base + ".scale", DType::kF8_E8M0, {ceil_div(out, 128), ceil_div(in, 128)});
  }
  // FP4 E2M1 weight [out, in] packed two per byte (I8 [out, in/2]) with a scale per 32 inputs.
  void fp4(const std::string& base, int64_t out, int64_t in) {
    add(base + ".weight", DType::kI8, {out, in / 2});
    add(base + ".scale", DType::kF8_E8M0, {out, ceil_div(in, 32)});
  }

 private:
  std::vector<TensorSpec>* out_;
};

}  // namespace

std::string layer_prefix(const ModelConfig& c, int layer) {
  if (layer < c.num_layers) return fmt::format("layers.{}.", layer);
  return fmt::format("mtp.{}.", layer - c.num_layers);
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  SpecList s(&specs);
  const int64_t D = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, H = c.num_heads, hd = c.head_dim;
  const int64_t I = c.moe_intermediate, E = c.n_routed_experts;
  s.add("embed.weight", DType::kBF16, {V, D});
  s.add("head.weight", DType::kBF16, {V, D});
  s.add("norm.weight", DType::kBF16, {D});
  s.add("hc_head_fn", DType::kF32, {hc, hc * D});
  s.add("hc_head_base", DType::kF32, {hc});
  s.add("hc_head_scale", DType::kF32, {1});

  for (const LayerSpec& l : c.layers) {
    const std::string p = layer_prefix(c, l.index);
    const int64_t mix = (2 + hc) * hc;
    for (const char* site : {"attn", "ffn"}) {
      s.add(p + "hc_" + site + "_fn", DType::kF32, {mix, hc * D});
      s.add(p + "hc_" + site + "_base", DType::kF32, {mix});
      s.add(p + "hc_" + site + "_scale", DType::kF32, {3});
    }
    s.add(p + "attn_norm.weight", DType::kBF16, {D});
    s.add(p + "ffn_norm.weight", DType::kBF16, {D});
    s.add(p + "attn.attn_sink", DType::kF32, {H});
    s.fp8(p + "attn.wq_a", c.q_lora_rank, D);
    s.add(p + "attn.q_norm.weight", DType::kBF16, {c.q_lora_rank});
    s.fp8(p + "attn.wq_b", H * hd, c.q_lora_rank);
    s.fp8(p + "attn.wkv", hd, D);
    s.add(p + "attn.kv_norm.weight", DType::kBF16, {hd});
    s.fp8(p + "attn.wo_a", int64_t(c.o_groups) * c.o_lora_rank, H * hd / c.o_groups);
    s.fp8(p + "attn.wo_b", D, int64_t(c.o_groups) * c.o_lora_rank);
    if (l.compress_ratio != 0) {
      const int64_t coff = l.kind == AttentionKind::kCSA ? 2 : 1;
      s.add(p + "attn.compressor.ape", DType::kF32, {l.compress_ratio, coff * hd});
      s.add(p + "attn.compressor.wkv.weight", DType::kBF16, {coff * hd, D});
      s.add(p + "attn.compressor.wgate.weight", DType::kBF16, {coff * hd, D});
      s.add(p + "attn.compressor.norm.weight", DType::kBF16, {hd});
    }
    if (l.kind == AttentionKind::kCSA) {
      const int64_t ih = c.index_n_heads, id = c.index_head_dim;
      s.fp8(p + "attn.indexer.wq_b", ih * id, c.q_lora_rank);
      s.add(p + "attn.indexer.weights_proj.weight", DType::kBF16, {ih, D});
      s.add(p + "attn.indexer.compressor.ape", DType::kF32, {l.compress_ratio, 2 * id});
      s.add(p + "attn.indexer.compressor.wkv.weight", DType::kBF16, {2 * id, D});
      s.add(p + "attn.indexer.compressor.wgate.weight", DType::kBF16, {2 * id, D});
      s.add(p + "attn.indexer.compressor.norm.weight", DType::kBF16, {id});
    }
    s.add(p + "ffn.gate.weight", DType::kBF16, {E, D});
    if (l.hash_routed) {
      s.add(p + "ffn.gate.tid2eid", DType::kI64, {V, c.n_experts_per_token});
    } else {
      s.add(p + "ffn.gate.bias", DType::kF32, {E});
    }
    s.fp8(p + "ffn.shared_experts.w1", I, D);
    s.fp8(p + "ffn.shared_experts.w3", I, D);
    s.fp8(p + "ffn.shared_experts.w2", D, I);
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = fmt::format("{}ffn.experts.{}.", p, e);
      s.fp4(ep + "w1", I, D);
      s.fp4(ep + "w3", I, D);
      s.fp4(ep + "w2", D, I);
    }
    if (l.is_mtp) {
      s.fp8(p + "e_proj", D, D);
      s.fp8(p + "h_proj", D, D);
      s.add(p + "enorm.weight", DType::kBF16, {D});
      s.add(p + "hnorm.weight", DType::kBF16, {D});
      s.add(p + "norm.weight", DType::kBF16, {D});
      s.add(p + "hc_head_fn", DType::kF32, {hc, hc * D});
      s.add(p + "hc_head_base", DType::kF32, {hc});
      s.add(p + "hc_head_scale", DType::kF32, {1});
    }
  }
  return specs;
}

SchemaReport check_schema(const ModelConfig& c, const std::map<std::string, TensorRef>& tensors,
                          const std::string& dir) {
  SchemaReport r;
  // The engine runs the main layers and (as a drafter) the first MTP layer; later MTP layers
  // are not required, and a problem in mtp.0 only costs the drafter.
  const std::string drafter = c.num_mtp_layers > 0 ? layer_prefix(c, c.num_layers) : std::string("-");
  auto starts = [](const std::string& name, const std::string& prefix) { return name.rfind(prefix, 0) == 0; };
  std::map<std::string, bool> expected;
  for (const TensorSpec& spec : expected_tensors(c)) {
    if (starts(spec.name, "mtp.") && !starts(spec.name, drafter)) continue;
    expected[spec.name] = true;
    std::vector<std::string>& out = starts(spec.name, drafter) ? r.mtp_problems : r.problems;
    auto it = tensors.find(spec.name);
    if (it == tensors.end()) {
      out.push_back(fmt::format("{}: tensor {} is missing", dir, spec.name));
      continue;
    }
    const TensorInfo& info = *it->second.info;
    const std::string& file = it->second.shard->path();
    if (info.dtype != spec.dtype) {
      out.push_back(fmt::format("{}: tensor {} has dtype {}, expected {}", file, spec.name, dtype_name(info.dtype),
                                dtype_name(spec.dtype)));
    }
    if (info.shape != spec.shape) {
      TensorInfo want;
      want.shape = spec.shape;
      out.push_back(fmt::format("{}: tensor {} has shape {}, expected {}", file, spec.name, info.shape_string(),
                                want.shape_string()));
    }
  }
  for (const auto& [name, ref] : tensors) {
    if (expected.count(name)) continue;
    if (starts(name, "mtp."))
      r.unused.push_back(name);
    else
      r.problems.push_back(fmt::format("{}: tensor {} is not part of the model described by {}", ref.shard->path(),
                                       name, c.source));
  }
  return r;
}

}  // namespace dsv4
