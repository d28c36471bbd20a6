#include "dsv4/model/weights.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "dsv4/io/schema.h"
#include "dsv4/io/value_check.h"
#include "dsv4/kernels/formats.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

using kernels::WeightFormat;

// A BF16 value with an all-ones exponent is Inf or NaN; it would turn every logit into NaN.
// `first_index` is the index of v[0] within the tensor, for the message.
void require_finite_bf16(const SafetensorsFile& shard, const std::string& tensor, const uint16_t* v, int64_t n,
                         int64_t first_index) {
  const int64_t i = find_nonfinite_bf16(v, n);
  if (i >= 0) fail("{}: tensor {} holds a non-finite value at index {}", shard.path(), tensor, first_index + i);
}

class Loader {
 public:
  Loader(const Checkpoint& ck, ModelWeights& w, IoFaults* faults) : ck_(ck), w_(w), reader_(faults) {}

  const uint8_t* bytes(const std::string& name) {
    const TensorRef& ref = ck_.get(name);
    w_.storage.emplace_back(ref.info->bytes);
    read(ref, w_.storage.back().data());
    return w_.storage.back().data();
  }

  Matrix matrix(const std::string& name, WeightFormat format) {
    const TensorRef& ref = ck_.get(name + ".weight");
    Matrix m;
    m.format = format;
    m.rows = ref.info->shape[0];
    m.cols = ref.info->shape[1];
    m.data = bytes(name + ".weight");
    if (format == WeightFormat::kFP8) {
      m.scales = bytes(name + ".scale");
      const auto* codes = static_cast<const uint8_t*>(m.data);
      if (const int64_t i = find_nan_e4m3(codes, m.data_bytes()); i >= 0)
        fail("{}: tensor {}.weight holds a NaN encoding (0x{:02X}) at index {}", ref.shard->path(), name, codes[i], i);
      if (const int64_t i = find_bad_e8m0(m.scales, m.scale_bytes()); i >= 0)
        fail("{}: tensor {}.scale holds the E8M0 scale {} at index {}; scales above 2^32 are refused",
             ck_.get(name + ".scale").shard->path(), name, describe_e8m0(m.scales[i]), i);
    } else if (format == WeightFormat::kBF16) {
      require_finite_bf16(*ref.shard, name + ".weight", static_cast<const uint16_t*>(m.data), m.rows * m.cols, 0);
    }
    return m;
  }

  Matrix f32_matrix(const std::string& name) {
    const TensorRef& ref = ck_.get(name);
    Matrix m;
    m.format = WeightFormat::kF32;
    m.rows = ref.info->shape[0];
    m.cols = ref.info->shape[1];
    m.data = bytes(name);
    check_finite(name, static_cast<const float*>(m.data), m.rows * m.cols);
    return m;
  }

  // Small vectors widened to float32 (BF16 or F32 in the file).
  std::vector<float> vec(const std::string& name) {
    const TensorRef& ref = ck_.get(name);
    std::vector<uint8_t> raw(ref.info->bytes);
    read(ref, raw.data());
    const int64_t n = ref.info->numel();
    std::vector<float> out(static_cast<size_t>(n));
    if (ref.info->dtype == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(uint16_t(raw[2 * i] | (raw[2 * i + 1] << 8)));
    } else if (ref.info->dtype == DType::kF32) {
      std::memcpy(out.data(), raw.data(), raw.size());
    } else {
      fail("{}: tensor {} has unexpected dtype {}", ref.shard->path(), name, dtype_name(ref.info->dtype));
    }
    check_finite(name, out.data(), n);
    return out;
  }

  std::vector<int32_t> tid2eid(const std::string& name, int64_t n_experts) {
    const TensorRef& ref = ck_.get(name);
    std::vector<int64_t> raw(static_cast<size_t>(ref.info->numel()));
    read(ref, raw.data());
    std::vector<int32_t> out(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] < 0 || raw[i] >= n_experts)
        fail("{}: tensor {} holds expert id {} at index {}, outside [0, {})", ref.shard->path(), name, raw[i], i,
             n_experts);
      out[i] = static_cast<int32_t>(raw[i]);
    }
    return out;
  }

 private:
  void read(const TensorRef& ref, void* dst) { reader_.read(ref.shard->file(), dst, ref.info->bytes, ref.info->offset); }

  void check_finite(const std::string& name, const float* v, int64_t n) {
    // An all-ones exponent is Inf or NaN; tested on the bits, which vectorizes.
    const int64_t i = find_nonfinite_f32(v, n);
    if (i >= 0) fail("{}: tensor {} holds a non-finite value at index {}", ck_.get(name).shard->path(), name, i);
  }

  const Checkpoint& ck_;
  ModelWeights& w_;
  BulkReader reader_;
};

CompressorWeights load_compressor(Loader& ld, const std::string& p, int ratio, int dim, bool overlap) {
  CompressorWeights c;
  c.ratio = ratio;
  c.dim = dim;
  c.overlap = overlap;
  c.wkv = ld.matrix(p + "wkv", WeightFormat::kBF16);
  c.wgate = ld.matrix(p + "wgate", WeightFormat::kBF16);
  c.ape = ld.vec(p + "ape");
  c.norm = ld.vec(p + "norm.weight");
  return c;
}

}  // namespace

EmbeddingRows::EmbeddingRows(const SafetensorsFile& shard, const TensorInfo& info, IoFaults* faults)
    : shard_(&shard), info_(&info), faults_(faults) {
  if (info.dtype != DType::kBF16 || info.shape.size() != 2 || uint64_t(info.numel()) * 2 != info.bytes)
    fail("{}: tensor {} must be BF16 [V, D], got {} {}", shard.path(), info.name, dtype_name(info.dtype),
         info.shape_string());
  rows_ = info.shape[0];
  cols_ = info.shape[1];
}

void EmbeddingRows::row(int32_t token, float* out, uint16_t* raw) const {
  if (token < 0 || token >= rows_) fail("{}: token id {} outside the embedding's {} rows", shard_->path(), token, rows_);
  shard_->file().read_exact(raw, static_cast<size_t>(cols_) * 2, info_->offset + uint64_t(token) * uint64_t(cols_) * 2,
                            faults_);
  require_finite_bf16(*shard_, info_->name, raw, cols_, int64_t(token) * cols_);
  for (int64_t i = 0; i < cols_; ++i) out[i] = bf16_to_f32(raw[i]);
}

ModelWeights ModelWeights::load(const Checkpoint& ck, bool with_mtp, IoFaults* faults) {
  const ModelConfig& c = ck.config();
  ModelWeights w;
  Loader ld(ck, w, faults);
  const TensorRef& embed = ck.get("embed.weight");
  w.embed = EmbeddingRows(*embed.shard, *embed.info, faults);
  w.head = ld.matrix("head", WeightFormat::kBF16);
  w.norm = ld.vec("norm.weight");
  w.hc_head_fn = ld.f32_matrix("hc_head_fn");
  w.hc_head_base = ld.vec("hc_head_base");
  w.hc_head_scale = ld.vec("hc_head_scale");

  const int64_t R = c.o_lora_rank, G = c.o_groups;
  // Group g of wo_a is rows [g*R, g*R+R). A row view keeps the 128-row scale grid only if
  // the group starts on a block boundary or all groups share the first block row.
  if (R % 128 != 0 && G * R > 128)
    fail("{}: o_lora_rank {} with o_groups {} splits FP8 scale blocks between groups; not supported", c.source, R, G);

  for (const LayerSpec& spec : c.layers) {
    if (spec.is_mtp && (!with_mtp || spec.index != c.num_layers)) continue;  // only mtp.0 drafts
    const std::string p = layer_prefix(c, spec.index);
    LayerWeights L;
    L.spec = spec;
    for (auto [site, hcw] : {std::pair{"attn", &L.hc_attn}, std::pair{"ffn", &L.hc_ffn}}) {
      hcw->fn = ld.f32_matrix(p + "hc_" + site + "_fn");
      hcw->base = ld.vec(p + "hc_" + site + "_base");
      hcw->scale = ld.vec(p + "hc_" + site + "_scale");
    }
    L.attn_norm = ld.vec(p + "attn_norm.weight");
    L.ffn_norm = ld.vec(p + "ffn_norm.weight");

    AttentionWeights& a = L.attn;
    a.wq_a = ld.matrix(p + "attn.wq_a", WeightFormat::kFP8);
    a.q_norm = ld.vec(p + "attn.q_norm.weight");
    a.wq_b = ld.matrix(p + "attn.wq_b", WeightFormat::kFP8);
    a.wkv = ld.matrix(p + "attn.wkv", WeightFormat::kFP8);
    a.kv_norm = ld.vec(p + "attn.kv_norm.weight");
    Matrix wo_a = ld.matrix(p + "attn.wo_a", WeightFormat::kFP8);
    for (int64_t g = 0; g < G; ++g) {
      Matrix part = wo_a;
      part.rows = R;
      part.data = static_cast<const uint8_t*>(wo_a.data) + g * R * wo_a.cols;
      part.scales = wo_a.scales + (g * R / 128) * ((wo_a.cols + 127) / 128);
      a.wo_a.push_back(part);
    }
    a.wo_b = ld.matrix(p + "attn.wo_b", WeightFormat::kFP8);
    a.sink = ld.vec(p + "attn.attn_sink");
    if (spec.compress_ratio != 0) {
      a.compressor = load_compressor(ld, p + "attn.compressor.", spec.compress_ratio, c.head_dim,
                                     spec.kind == AttentionKind::kCSA);
    }
    if (spec.kind == AttentionKind::kCSA) {
      IndexerWeights ix;
      ix.wq_b = ld.matrix(p + "attn.indexer.wq_b", WeightFormat::kFP8);
      ix.weights_proj = ld.matrix(p + "attn.indexer.weights_proj", WeightFormat::kBF16);
      ix.compressor = load_compressor(ld, p + "attn.indexer.compressor.", spec.compress_ratio, c.index_head_dim, true);
      a.indexer = std::move(ix);
    }

    MoeWeights& m = L.moe;
    m.gate = ld.matrix(p + "ffn.gate", WeightFormat::kBF16);
    if (spec.hash_routed) {
      m.tid2eid = ld.tid2eid(p + "ffn.gate.tid2eid", c.n_routed_experts);
    } else {
      m.bias = ld.vec(p + "ffn.gate.bias");
    }
    m.shared_w1 = ld.matrix(p + "ffn.shared_experts.w1", WeightFormat::kFP8);
    m.shared_w3 = ld.matrix(p + "ffn.shared_experts.w3", WeightFormat::kFP8);
    m.shared_w2 = ld.matrix(p + "ffn.shared_experts.w2", WeightFormat::kFP8);

    if (spec.is_mtp) {
      MtpWeights t;
      t.e_proj = ld.matrix(p + "e_proj", WeightFormat::kFP8);
      t.h_proj = ld.matrix(p + "h_proj", WeightFormat::kFP8);
      t.enorm = ld.vec(p + "enorm.weight");
      t.hnorm = ld.vec(p + "hnorm.weight");
      t.norm = ld.vec(p + "norm.weight");
      t.hc_head_fn = ld.f32_matrix(p + "hc_head_fn");
      t.hc_head_base = ld.vec(p + "hc_head_base");
      t.hc_head_scale = ld.vec(p + "hc_head_scale");
      L.mtp = std::move(t);
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace dsv4
