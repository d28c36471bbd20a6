#include "dsv4/synth/synth.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <map>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/io/config.h"
#include "dsv4/io/safetensors_writer.h"
#include "dsv4/io/schema.h"
#include "dsv4/kernels/formats.h"
#include "dsv4/synth/demo_tokenizer.h"
#include "dsv4/util/error.h"
#include "dsv4/platform/platform.h"
#include "dsv4/util/file.h"

namespace dsv4 {
namespace {

// xoshiro256** seeded through splitmix64: fast (about 1 ns per 8 bytes) and good enough
// for weights nobody will ever train.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint64_t fnv1a(std::string_view s, uint64_t h = 0xCBF29CE484222325ull) {
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
  return h;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// FP8 E4M3 codes used for weights: exponent fields 5..8 (|v| in [0.25, 3.75]), both signs.
// Never NaN (0x7F / 0xFF), never subnormal; 64 codes so a random byte picks one with & 63.
struct Fp8Table {
  uint8_t code[64];
  double rms = 0;
  Fp8Table() {
    double sq = 0;
    for (int i = 0; i < 64; ++i) {
      const int sign = i >> 5, exp = 5 + ((i >> 3) & 3), man = i & 7;
      code[i] = static_cast<uint8_t>((sign << 7) | (exp << 3) | man);
      const double v = fp8_e4m3_to_f32(code[i]);
      sq += v * v;
    }
    rms = std::sqrt(sq / 64);
  }
};

// RMS of a uniformly random FP4 E2M1 code (values 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives).
double fp4_code_rms() {
  double sq = 0;
  for (int c = 0; c < 16; ++c) sq += double(kFp4Values[c]) * kFp4Values[c];
  return std::sqrt(sq / 16);
}

// Scales get a random exponent jitter of {-1, 0, 0, +1}; E[2^(2j)] = (1/4 + 1 + 1 + 4) / 4.
constexpr double kJitterGain = 1.25;  // sqrt(6.25 / 4)

// E8M0 byte of the power of two that brings codes of RMS `code_rms` to `target_rms`.
uint8_t scale_byte(double target_rms, double code_rms) {
  const int k = static_cast<int>(std::lround(std::log2(target_rms / (code_rms * kJitterGain))));
  return static_cast<uint8_t>(std::clamp(127 + k, 2, 252));
}

enum class Fill {
  kFp8Codes, kFp4Codes, kScales, kBf16Uniform, kF32Uniform, kTid2eid,
};

// What --routing-skew changes in a tensor (RoutingSkew in synth.h).
enum class Skew : uint8_t {
  kNone,
  kEmbed,          // embed.weight: the token's topic channel set, the other topic channels 0
  kHead,           // head.weight: a pull towards the token's topic channel
  kGate,           // a scored layer's ffn.gate.weight: pulls towards the layer's home experts
  kBias,           // ffn.gate.bias: per-layer popularity
  kZeroTopicRows,  // attn.wo_b, shared and routed w2: no write into the topic channels
};

struct TensorPlan {
  TensorDecl decl;
  Fill fill = Fill::kF32Uniform;
  float lo = 0, hi = 0;   // uniform fills
  uint8_t scale = 127;    // kScales: base E8M0 byte
  Skew skew = Skew::kNone;
  int layer = -1;         // kGate, kBias: the main layer
};

// The topic of a token id: a fixed hash, so topics interleave over the vocabulary.
int topic_of(int64_t token, int topics) {
  uint64_t z = static_cast<uint64_t>(token) * 0x9E3779B97F4A7C15ull;
  z ^= z >> 29;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 32;
  return static_cast<int>(z % static_cast<uint64_t>(topics));
}

int main_layer_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}

// How each tensor of the schema is filled. Every linear keeps unit-RMS inputs unit-RMS.
std::vector<TensorPlan> plan_tensors(const ModelConfig& c) {
  static const Fp8Table fp8;
  std::vector<TensorPlan> plans;
  for (const TensorSpec& spec : expected_tensors(c)) {
    TensorPlan p;
    p.decl = {spec.name, spec.dtype, spec.shape};
    const std::string& n = spec.name;
    auto uniform_rms = [&](double rms) {  // uniform on [-a, a] has RMS a / sqrt(3)
      p.lo = static_cast<float>(-rms * std::sqrt(3.0));
      p.hi = -p.lo;
    };
    switch (spec.dtype) {
      case DType::kF8_E4M3:
        p.fill = Fill::kFp8Codes;
        break;
      case DType::kI8:
        p.fill = Fill::kFp4Codes;
        break;
      case DType::kF8_E8M0: {
        p.fill = Fill::kScales;
        const std::string weight = n.substr(0, n.size() - 5) + "weight";  // "...scale" -> "...weight"
        const TensorPlan* w = nullptr;
        for (auto it = plans.rbegin(); it != plans.rend(); ++it)
          if (it->decl.name == weight) {
            w = &*it;
            break;
          }
        if (!w) fail("synth: scale {} precedes its weight", n);
        if (w->fill == Fill::kFp8Codes) {
          p.scale = scale_byte(1.0 / std::sqrt(double(w->decl.shape[1])), fp8.rms);
        } else {
          p.scale = scale_byte(1.0 / std::sqrt(double(w->decl.shape[1] * 2)), fp4_code_rms());
        }
        break;
      }
      case DType::kBF16:
        p.fill = Fill::kBf16Uniform;
        if (spec.shape.size() == 1) {  // RMSNorm weights
          p.lo = 0.8f;
          p.hi = 1.2f;
        } else if (n == "embed.weight") {
          uniform_rms(1.0);
        } else {
          uniform_rms(1.0 / std::sqrt(double(spec.shape[1])));
        }
        break;
      case DType::kF32:
        p.fill = Fill::kF32Uniform;
        if (ends_with(n, "_fn")) {
          uniform_rms(1.0 / std::sqrt(double(spec.shape[1])));
        } else if (ends_with(n, "_scale")) {
          p.lo = 0.5f, p.hi = 1.0f;
        } else if (ends_with(n, "_base") || ends_with(n, "attn_sink")) {
          p.lo = -0.5f, p.hi = 0.5f;
        } else {  // compressor ape, gate.bias
          p.lo = -0.1f, p.hi = 0.1f;
        }
        break;
      case DType::kI64:
        p.fill = Fill::kTid2eid;
        break;
      default:
        fail("synth: no fill rule for tensor {} of dtype {}", n, dtype_name(spec.dtype));
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

void mark_skew(std::vector<TensorPlan>& plans, const RoutingSkew& r) {
  if (!r.on) return;
  for (TensorPlan& p : plans) {
    const std::string& n = p.decl.name;
    p.layer = main_layer_of(n);
    if (n == "embed.weight") p.skew = Skew::kEmbed;
    else if (n == "head.weight") p.skew = Skew::kHead;
    else if (p.layer >= 0 && ends_with(n, "ffn.gate.weight")) p.skew = Skew::kGate;
    else if (p.layer >= 0 && ends_with(n, "ffn.gate.bias")) p.skew = Skew::kBias;
    else if (ends_with(n, ".w2.weight") || ends_with(n, "attn.wo_b.weight")) p.skew = Skew::kZeroTopicRows;
  }
}

// A scored layer's affinity of expert e to topic k, [E * topics]: each topic's home set of
// `home_experts` distinct experts, graded from 1 down by home_slope.
std::vector<float> home_affinity(const RoutingSkew& r, int layer, int64_t E, uint64_t seed) {
  std::vector<float> a(static_cast<size_t>(E * r.topics), 0.0f);
  Rng rng(fnv1a(fmt::format("home.{}", layer), seed * 0x9E3779B97F4A7C15ull + 7));
  // Layers differ: the home set's size is home_experts x 2^u, u uniform in [-1.5, 1.5] per layer,
  // so each layer's working set outgrows the cache at a different size (a smooth LRU curve).
  const double u = rng.uniform(-1.5f, 1.5f);
  const int m = static_cast<int>(std::clamp<int64_t>(std::lround(r.home_experts * std::exp2(u)), 1, E));
  for (int k = 0; k < r.topics; ++k) {
    for (int j = 0; j < m; ++j) {
      int64_t e;
      do {
        e = static_cast<int64_t>(rng.next() % uint64_t(E));
      } while (a[size_t(e * r.topics + k)] != 0.0f);
      a[size_t(e * r.topics + k)] = static_cast<float>(1.0 - r.home_slope * double(j) / double(m));
    }
  }
  return a;
}

// gate.bias of a scored layer: a random popularity order, bias = spread * (1 - rank / E)^power.
std::vector<float> popularity_bias(const RoutingSkew& r, int layer, int64_t E, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
  Rng rng(fnv1a(fmt::format("popularity.{}", layer), seed * 0x9E3779B97F4A7C15ull + 11));
  for (int64_t i = E - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng.next() % uint64_t(i + 1))]);
  std::vector<float> bias(static_cast<size_t>(E));
  for (int64_t rank = 0; rank < E; ++rank)
    bias[size_t(order[size_t(rank)])] =
        static_cast<float>(r.bias_spread * std::pow(1.0 - double(rank) / double(E), r.bias_power));
  return bias;
}

// Streams one tensor's bytes into the writer, generated from a seed derived from the
// tensor's name (so sharding and chunking never change a byte).
void write_tensor(SafetensorsWriter& w, const TensorPlan& p, const ModelConfig& c, uint64_t seed,
                  const RoutingSkew& r) {
  static const Fp8Table fp8;
  Rng rng(fnv1a(p.decl.name, seed * 0x9E3779B97F4A7C15ull + 1));
  const uint64_t total = p.decl.bytes();
  // --routing-skew: the topic channels' values (RoutingSkew in synth.h).
  const int64_t D = c.hidden_size, K = r.on ? r.topics : 0;
  const double channel = r.embed_channel * std::sqrt(double(D));  // the embedding's topic value
  std::vector<float> affinity, bias;
  if (p.skew == Skew::kGate) affinity = home_affinity(r, p.layer, c.n_routed_experts, seed);
  if (p.skew == Skew::kBias) bias = popularity_bias(r, p.layer, c.n_routed_experts, seed);
  // The value of element (row, col < K) of a 2-D skewed BF16 tensor.
  auto topic_value = [&](int64_t row, int64_t col) -> float {
    switch (p.skew) {
      case Skew::kEmbed: return col == topic_of(row, r.topics) ? float(channel) : 0.0f;
      case Skew::kHead: return col == topic_of(row, r.topics) ? float(r.head_pull / channel) : 0.0f;
      case Skew::kGate:
        return float(r.router_pull * std::sqrt(1.0 + r.depth_gain * p.layer) * affinity[size_t(row * K + col)] / channel);
      default: return 0.0f;
    }
  };
  const bool skew_bf16 = p.skew == Skew::kEmbed || p.skew == Skew::kHead || p.skew == Skew::kGate;
  const uint64_t zero_bytes =
      p.skew == Skew::kZeroTopicRows ? uint64_t(K) * (total / uint64_t(p.decl.shape[0])) : 0;
  if (p.fill == Fill::kTid2eid) {
    // Each token routes to K distinct experts.
    const int64_t V = p.decl.shape[0], K = p.decl.shape[1];
    std::vector<int64_t> ids(static_cast<size_t>(V * K));
    for (int64_t t = 0; t < V; ++t) {
      int64_t* row = ids.data() + t * K;
      for (int64_t k = 0; k < K; ++k) {
        int64_t e;
        do {
          e = static_cast<int64_t>(rng.next() % uint64_t(c.n_routed_experts));
        } while (std::find(row, row + k, e) != row + k);
        row[k] = e;
      }
    }
    w.write(ids.data(), total);
    return;
  }
  // Chunks are multiples of 8 bytes, so no element straddles two chunks.
  const uint64_t chunk = w.buffer_capacity() / 8 * 8;
  for (uint64_t done = 0; done < total;) {
    const uint64_t n = std::min(chunk, total - done);
    uint8_t* dst = w.reserve(n);
    switch (p.fill) {
      case Fill::kFp4Codes: {  // every nibble is a valid E2M1 code
        uint64_t i = 0;
        for (; i + 8 <= n; i += 8) {
          const uint64_t r = rng.next();
          std::memcpy(dst + i, &r, 8);
        }
        for (; i < n; ++i) dst[i] = static_cast<uint8_t>(rng.next());
        break;
      }
      case Fill::kFp8Codes: {
        uint64_t i = 0;
        while (i < n) {
          uint64_t r = rng.next();
          for (int b = 0; b < 8 && i < n; ++b, ++i, r >>= 8) dst[i] = fp8.code[r & 63];
        }
        break;
      }
      case Fill::kScales: {
        static constexpr int kJitter[4] = {-1, 0, 0, 1};
        uint64_t i = 0;
        while (i < n) {
          uint64_t r = rng.next();
          for (int b = 0; b < 32 && i < n; ++b, ++i, r >>= 2) dst[i] = static_cast<uint8_t>(p.scale + kJitter[r & 3]);
        }
        break;
      }
      case Fill::kBf16Uniform:
        for (uint64_t i = 0; i < n; i += 2) {
          float v = rng.uniform(p.lo, p.hi);
          if (skew_bf16) {
            const int64_t at = int64_t((done + i) / 2), col = at % D;
            if (col < K) v = topic_value(at / D, col);
          }
          const uint16_t h = f32_to_bf16(v);
          dst[i] = static_cast<uint8_t>(h);
          dst[i + 1] = static_cast<uint8_t>(h >> 8);
        }
        break;
      case Fill::kF32Uniform:
        for (uint64_t i = 0; i < n; i += 4) {
          float v = rng.uniform(p.lo, p.hi);
          if (!bias.empty()) v = bias[size_t((done + i) / 4)];
          std::memcpy(dst + i, &v, 4);
        }
        break;
      case Fill::kTid2eid:
        break;
    }
    if (done < zero_bytes) std::memset(dst, 0, static_cast<size_t>(std::min(n, zero_bytes - done)));  // code 0 is +0
    done += n;
  }
}

// The official index's sharding, each shard's tensors in the safetensors library's order.
std::vector<std::vector<size_t>> official_shards(const std::vector<TensorPlan>& plans, const ModelConfig& c) {
  std::map<int, std::vector<size_t>> by_shard;
  for (size_t i = 0; i < plans.size(); ++i) by_shard[official_shard_of(plans[i].decl.name, c.num_layers)].push_back(i);
  std::vector<std::vector<size_t>> shards;
  for (auto& [index, members] : by_shard) {
    std::stable_sort(members.begin(), members.end(), [&](size_t a, size_t b) {
      return safetensors_before(plans[a].decl.dtype, plans[a].decl.name, plans[b].decl.dtype, plans[b].decl.name);
    });
    shards.push_back(std::move(members));
  }
  return shards;
}

// Module (schema) order, a new shard when the next tensor would overflow `shard_bytes`.
std::vector<std::vector<size_t>> sized_shards(const std::vector<TensorPlan>& plans, uint64_t shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_size = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const uint64_t b = plans[i].decl.bytes();
    if (shard_size > 0 && shard_size + b > shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(i);
    shard_size += b;
  }
  return shards;
}

void write_text(const std::string& path, const std::string& text) {
  FILE* f = platform::fopen_utf8(path, "wb");
  if (!f) fail("{}: cannot create", path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) fail("{}: write failed", path);
}

void make_dirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!partial.empty() && !is_directory(partial) && !platform::make_directory(partial) && !is_directory(partial))
        fail("{}: cannot create directory", partial);
    }
    if (i < dir.size()) partial += dir[i];
  }
}

std::vector<int> schedule(const SynthOptions& o) {
  // The real Flash schedule is [0, 0] + [4, 128] x 20 + [4] for 43 layers: a few sliding-only
  // layers first, then CSA and HCA alternating; Pro's is [128, 128] + [4, 128] x 29 + [4] for
  // 61 (HCA first). Keep those proportions for N layers.
  const int n = o.layers;
  std::vector<int> ratios;
  if (o.preset == SynthPreset::kPro) {
    const int n_hca = static_cast<int>(std::lround(2.0 * n / 61));
    for (int i = 0; i < n; ++i) ratios.push_back(i < n_hca ? 128 : ((i - n_hca) % 2 == 0 ? 4 : 128));
  } else {
    const int n_swa = n == 1 ? 1 : std::clamp(static_cast<int>(std::lround(2.0 * n / 43)), 1, n - 1);
    for (int i = 0; i < n; ++i) ratios.push_back(i < n_swa ? 0 : ((i - n_swa) % 2 == 0 ? 4 : 128));
  }
  for (int i = 0; i < o.mtp_layers; ++i) ratios.push_back(0);
  return ratios;
}

int hash_layer_count(const SynthOptions& o) {
  if (o.hash_layers >= 0) return o.hash_layers;
  if (o.layers < 2) return 0;
  const double of = o.preset == SynthPreset::kPro ? 61 : 43;  // 3 hash layers in both models
  return std::clamp(static_cast<int>(std::lround(3.0 * o.layers / of)), 1, o.layers - 1);
}

void check_options(const SynthOptions& o) {
  auto positive = [](int64_t v, const char* flag) {
    if (v <= 0) fail("{} must be positive, got {}", flag, v);
  };
  if (o.out.empty()) fail("--out is required");
  positive(o.layers, "--layers");
  positive(o.experts, "--experts");
  positive(o.hidden, "--hidden");
  positive(o.moe_inter, "--moe-inter");
  positive(o.vocab, "--vocab");
  if (o.layers > 1024) fail("--layers {} is more than 1024", o.layers);
  if (o.experts_per_token > o.experts)
    fail("--experts-per-token {} exceeds --experts {}", o.experts_per_token, o.experts);
  if (o.hidden % 64 || o.moe_inter % 64) fail("--hidden and --moe-inter must be multiples of 64");
  if (o.hash_layers > o.layers) fail("--hash-layers {} exceeds --layers {}", o.hash_layers, o.layers);
  if (o.shard_bytes < (1u << 20)) fail("--shard-size must be at least 1M");
  if (o.routing.on && (o.routing.topics < 1 || o.routing.topics > o.hidden / 4))
    fail("--routing-skew needs hidden >= 4 x {} topic channels, got hidden {}", o.routing.topics, o.hidden);
  if (o.tokenizer && o.vocab != 256 + o.bpe_merges + 16)
    fail("a tokenizer needs vocab = 256 + merges + 16 = {}, got {}", 256 + o.bpe_merges + 16, o.vocab);
}

}  // namespace

RoutingSkew real_routing_skew() {
  RoutingSkew r;
  r.on = true;
  return r;
}

SynthOptions synth_preset(SynthPreset preset) {
  SynthOptions o;  // the defaults are V4 Flash's
  if (preset == SynthPreset::kPro) {
    o.preset = SynthPreset::kPro;
    o.hidden = 7168;
    o.heads = 128;
    o.q_lora = 1536;
    o.o_groups = 16;
    o.o_lora = 1024;
    o.experts = 384;
    o.moe_inter = 3072;
    o.index_topk = 1024;
    o.routed_scaling = 2.5;
  }
  return o;
}

SynthOptions demo_synth_options(const std::string& out) {
  SynthOptions o;
  o.out = out;
  o.layers = 6;
  o.experts = 32;
  o.experts_per_token = 6;
  o.hidden = 512;
  o.heads = 8;
  o.head_dim = 128;
  o.rope_dim = 32;
  o.q_lora = 256;
  o.o_groups = 2;
  o.o_lora = 128;
  o.moe_inter = 512;
  o.bpe_merges = 752;
  o.vocab = 256 + 752 + 16;  // 1024
  o.sliding_window = 128;
  o.index_heads = 8;
  o.index_head_dim = 64;
  o.index_topk = 64;
  o.compress_ratios = {0, 0, 4, 128, 4, 128};  // the real model's first six layers
  o.hash_layers = 3;  // as the real model: layers 0-2 (SWA, SWA, CSA) route by token id
  o.seed = 4;
  o.tokenizer = true;
  o.shard_bytes = 64ull << 20;
  o.drop_page_cache = false;
  return o;
}

std::string synth_config_json(const SynthOptions& o) {
  check_options(o);
  using Json = nlohmann::ordered_json;
  std::vector<int> ratios = o.compress_ratios.empty() ? schedule(o) : o.compress_ratios;
  for (int i = 0; i < o.mtp_layers && o.compress_ratios.size() == size_t(o.layers); ++i) ratios.push_back(0);
  const int64_t bos = o.tokenizer ? o.vocab - 16 : 0, eos = o.tokenizer ? o.vocab - 15 : 1;
  Json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos;
  j["eos_token_id"] = eos;
  j["expert_dtype"] = "fp4";
  j["hc_eps"] = 1e-06;
  j["hc_mult"] = 4;
  j["hc_sinkhorn_iters"] = 20;
  j["head_dim"] = o.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = o.hidden;
  j["index_head_dim"] = o.index_head_dim;
  j["index_n_heads"] = o.index_heads;
  j["index_topk"] = o.index_topk;
  j["initializer_range"] = 0.02;
  j["max_position_embeddings"] = 1048576;
  j["model_type"] = "deepseek_v4";
  j["moe_intermediate_size"] = o.moe_inter;
  j["n_routed_experts"] = o.experts;
  j["n_shared_experts"] = 1;
  j["norm_topk_prob"] = true;
  j["num_attention_heads"] = o.heads;
  j["num_experts_per_tok"] = o.experts_per_token;
  j["num_hidden_layers"] = o.layers;
  j["num_hash_layers"] = hash_layer_count(o);
  j["num_key_value_heads"] = 1;
  j["num_nextn_predict_layers"] = o.mtp_layers;
  j["o_groups"] = o.o_groups;
  j["o_lora_rank"] = o.o_lora;
  j["q_lora_rank"] = o.q_lora;
  j["qk_rope_head_dim"] = o.rope_dim;
  j["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
                              {"quant_method", "fp8"},          {"scale_fmt", "ue8m0"},
                              {"weight_block_size", {128, 128}}};
  j["rms_norm_eps"] = 1e-06;
  j["rope_scaling"] = {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 16},
                       {"original_max_position_embeddings", 65536}, {"type", "yarn"}};
  j["rope_theta"] = 10000;
  j["routed_scaling_factor"] = o.routed_scaling;
  j["scoring_func"] = "sqrtsoftplus";
  j["sliding_window"] = o.sliding_window;
  j["swiglu_limit"] = 10.0;
  j["tie_word_embeddings"] = false;
  j["topk_method"] = "noaux_tc";
  j["torch_dtype"] = "bfloat16";
  j["transformers_version"] = "4.57.1";
  j["use_cache"] = true;
  j["vocab_size"] = o.vocab;
  j["compress_rope_theta"] = 160000;
  j["compress_ratios"] = ratios;
  return j.dump(2) + "\n";
}

void synthesize(const SynthOptions& o, const SynthProgress& progress) {
  const std::string config_text = synth_config_json(o);
  // Validate with the engine's own config parser before writing gigabytes.
  const ModelConfig c = ModelConfig::from_json(config_text, o.out + "/config.json");
  make_dirs(o.out);

  std::vector<TensorPlan> plans = plan_tensors(c);
  mark_skew(plans, o.routing);
  const std::vector<std::vector<size_t>> shards =
      o.layout == TensorLayout::kOfficial ? official_shards(plans, c) : sized_shards(plans, o.shard_bytes);
  uint64_t total = 0;
  for (const TensorPlan& p : plans) total += p.decl.bytes();
  std::map<std::string, std::string> weight_map;
  uint64_t done = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<TensorDecl> decls;
    for (size_t i : shards[s]) {
      decls.push_back(plans[i].decl);
      weight_map[plans[i].decl.name] = name;
    }
    SafetensorsWriter w(o.out + "/" + name, decls, {{"format", "pt"}});
    for (size_t i : shards[s]) write_tensor(w, plans[i], c, o.seed, o.routing);
    w.finish(o.drop_page_cache);
    done += w.data_bytes();
    if (progress) progress(done, total);
  }
  write_safetensors_index(o.out + "/model.safetensors.index.json", weight_map, total);
  write_text(o.out + "/config.json", config_text);
  nlohmann::ordered_json gen;
  gen["_from_model_config"] = true;
  gen["bos_token_id"] = c.bos_token_id;
  gen["eos_token_id"] = c.eos_token_id;
  gen["do_sample"] = true;
  gen["temperature"] = 1.0;
  gen["top_p"] = 1.0;
  gen["transformers_version"] = "4.46.3";
  write_text(o.out + "/generation_config.json", gen.dump(2) + "\n");
  if (o.tokenizer) {
    write_text(o.out + "/tokenizer.json", demo_tokenizer_json(o.bpe_merges));
    write_text(o.out + "/tokenizer_config.json", demo_tokenizer_config_json());
  }
}

}  // namespace dsv4
