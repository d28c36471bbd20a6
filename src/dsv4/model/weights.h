// The resident (dense) part of the model, in the checkpoint's native formats: FP8 linears
// stay E4M3 + E8M0 block scales, BF16 stays BF16, F32 stays F32. Only the small vectors
// (norm weights, biases, sinks, ape; a few KiB per layer) are widened to float32.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dsv4/io/checkpoint.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/util/file.h"

namespace dsv4 {

using kernels::Matrix;

// mHC parameters of one sub-block: fn [(2+hc)*hc, hc*D] F32, base [(2+hc)*hc], scale [3].
struct HyperConnectionWeights {
  Matrix fn;
  std::vector<float> base;
  std::vector<float> scale;
};

// A compressor: kv = wkv·x, gate = wgate·x + ape[slot]; softmax-pooled per channel over a window.
struct CompressorWeights {
  int ratio = 0;     // m: tokens per compressed entry
  int dim = 0;       // entry width (head_dim for attention, index_head_dim for the indexer)
  bool overlap = false;  // CSA: two series, entry w pools window w-1 (A half) and w (B half)
  Matrix wkv;        // [coff*dim, D] BF16
  Matrix wgate;      // [coff*dim, D] BF16
  std::vector<float> ape;   // [ratio, coff*dim]
  std::vector<float> norm;  // [dim]
};

struct IndexerWeights {
  Matrix wq_b;          // [IH*Id, q_lora] FP8
  Matrix weights_proj;  // [IH, D] BF16
  CompressorWeights compressor;
};

struct AttentionWeights {
  Matrix wq_a;                // [q_lora, D] FP8
  std::vector<float> q_norm;  // [q_lora]
  Matrix wq_b;                // [H*hd, q_lora] FP8
  Matrix wkv;                 // [hd, D] FP8
  std::vector<float> kv_norm; // [hd]
  std::vector<Matrix> wo_a;   // one [R, H*hd/G] FP8 view per group g (rows g*R .. g*R+R-1)
  Matrix wo_b;                // [D, G*R] FP8
  std::vector<float> sink;    // [H]
  std::optional<CompressorWeights> compressor;
  std::optional<IndexerWeights> indexer;  // CSA only
};

struct MoeWeights {
  Matrix gate;                  // router [E, D] BF16
  std::vector<float> bias;      // [E] selection bias (top-k layers)
  std::vector<int32_t> tid2eid; // [V, K] (hash layers)
  Matrix shared_w1, shared_w3, shared_w2;  // FP8
};

struct MtpWeights {
  Matrix e_proj, h_proj;  // [D, D] FP8
  std::vector<float> enorm, hnorm, norm;
  Matrix hc_head_fn;
  std::vector<float> hc_head_base, hc_head_scale;
};

struct LayerWeights {
  LayerSpec spec;
  HyperConnectionWeights hc_attn, hc_ffn;
  std::vector<float> attn_norm, ffn_norm;
  AttentionWeights attn;
  MoeWeights moe;
  std::optional<MtpWeights> mtp;
};

// The token embedding [V, D] BF16 stays in the checkpoint file: a token needs one row
// (8 KiB for V4 Flash), so holding the 1 GiB table in RAM would only take that much from the
// expert cache. Rows are read with pread (the page cache keeps the frequent ones) and widened
// to float32 exactly, as a resident BF16 row would be.
class EmbeddingRows {
 public:
  EmbeddingRows() = default;
  // `faults`: the test fault layer for the row reads (null: none).
  EmbeddingRows(const SafetensorsFile& shard, const TensorInfo& info, IoFaults* faults = nullptr);
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // out[cols]; raw[cols] is scratch for the bytes as read. Throws Error naming the file and
  // tensor on a read error or a non-finite value.
  void row(int32_t token, float* out, uint16_t* raw) const;

 private:
  const SafetensorsFile* shard_ = nullptr;
  const TensorInfo* info_ = nullptr;
  IoFaults* faults_ = nullptr;
  int64_t rows_ = 0, cols_ = 0;
};

struct ModelWeights {
  EmbeddingRows embed;  // [V, D] BF16, read per token
  Matrix head;   // [V, D] BF16
  std::vector<float> norm;
  Matrix hc_head_fn;  // [hc, hc*D] F32
  std::vector<float> hc_head_base, hc_head_scale;
  std::vector<LayerWeights> layers;  // main layers, then (with_mtp) mtp.0

  std::vector<AlignedBuffer> storage;  // owns the bytes every Matrix above points into

  // Reads every non-expert tensor of the main layers, and of the first MTP layer when
  // something will run it (`with_mtp`). Throws Error naming the tensor on any problem.
  // `faults`: the test fault layer for those reads (null: none).
  static ModelWeights load(const Checkpoint& ck, bool with_mtp = false, IoFaults* faults = nullptr);
};

}  // namespace dsv4
