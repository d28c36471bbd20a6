#include <atomic>

#include <fmt/format.h>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/io/schema.h"
#include "dsv4/io/value_check.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4 {

uint64_t ExpertLocation::total_bytes() const {
  uint64_t total = 0;
  for (const Part& p : parts) total += p.bytes;
  return total;
}

ExpertLocation locate_expert(const Checkpoint& ck, int layer, int expert) {
  const std::string base = fmt::format("{}ffn.experts.{}.", layer_prefix(ck.config(), layer), expert);
  static const char* kNames[6] = {"w1.weight", "w1.scale", "w3.weight", "w3.scale", "w2.weight", "w2.scale"};
  ExpertLocation loc;
  for (int i = 0; i < 6; ++i) {
    const TensorRef& ref = ck.get(base + kNames[i]);
    loc.parts[i] = {ref.shard, ref.info->offset, ref.info->bytes};
  }
  return loc;
}

ExpertStats ExpertStats::operator-(const ExpertStats& e) const {
  ExpertStats d;
  d.requests = requests - e.requests;
  d.hits = hits - e.hits;
  d.misses = misses - e.misses;
  d.reads = reads - e.reads;
  d.bytes_read = bytes_read - e.bytes_read;
  d.demand_reads = demand_reads - e.demand_reads;
  d.predicted_reads = predicted_reads - e.predicted_reads;
  d.predicted_unused = predicted_unused - e.predicted_unused;
  d.expected_reads = expected_reads - e.expected_reads;
  d.read_requests = read_requests - e.read_requests;
  d.read_windows = read_windows - e.read_windows;
  d.read_pieces = read_pieces - e.read_pieces;
  d.merged_windows = merged_windows - e.merged_windows;
  d.read_retries = read_retries - e.read_retries;
  d.read_failures = read_failures - e.read_failures;
  d.stalls = stalls - e.stalls;
  d.read_seconds = read_seconds - e.read_seconds;
  d.blocked_seconds = blocked_seconds - e.blocked_seconds;
  d.folder_bytes = folder_bytes;
  d.folder_busy_seconds = folder_busy_seconds;
  for (size_t f = 0; f < d.folder_bytes.size() && f < e.folder_bytes.size(); ++f) d.folder_bytes[f] -= e.folder_bytes[f];
  for (size_t f = 0; f < d.folder_busy_seconds.size() && f < e.folder_busy_seconds.size(); ++f)
    d.folder_busy_seconds[f] -= e.folder_busy_seconds[f];
  return d;
}

ExpertWeights expert_views(const Checkpoint& ck, const uint8_t* base, const uint64_t offsets[6]) {
  return expert_views(ck.config(), base, offsets);
}

ExpertWeights expert_views(const ModelConfig& c, const uint8_t* base, const uint64_t offsets[6]) {
  auto fp4 = [&](int64_t rows, int64_t cols, int part) {
    kernels::Matrix m;
    m.format = kernels::WeightFormat::kFP4;
    m.rows = rows;
    m.cols = cols;
    m.data = base + offsets[part];
    m.scales = base + offsets[part + 1];
    return m;
  };
  ExpertWeights w;
  w.w1 = fp4(c.moe_intermediate, c.hidden_size, 0);
  w.w3 = fp4(c.moe_intermediate, c.hidden_size, 2);
  w.w2 = fp4(c.hidden_size, c.moe_intermediate, 4);
  return w;
}

std::string expert_scale_problem(const ModelConfig& c, int layer, int expert, const ExpertWeights& w, int* part,
                                 int64_t* index) {
  static const char* kScales[3] = {"w1.scale", "w3.scale", "w2.scale"};
  const kernels::Matrix* m[3] = {&w.w1, &w.w3, &w.w2};
  for (int i = 0; i < 3; ++i) {
    const int64_t bad = find_bad_e8m0(m[i]->scales, m[i]->scale_bytes());
    if (bad < 0) continue;
    if (part) *part = 2 * i + 1;
    if (index) *index = bad;
    return fmt::format("tensor {}ffn.experts.{}.{} holds the E8M0 scale {} at index {}; scales above 2^32 are refused",
                       layer_prefix(c, layer), expert, kScales[i], describe_e8m0(m[i]->scales[bad]), bad);
  }
  return "";
}

namespace {

class ResidentExperts final : public ExpertProvider {
 public:
  ResidentExperts(const Checkpoint& ck, int first_layer, int n_layers, IoFaults* faults) : first_layer_(first_layer) {
    const ModelConfig& c = ck.config();
    n_experts_ = c.n_routed_experts;
    experts_.resize(static_cast<size_t>(n_layers) * n_experts_);
    BulkReader reader(faults);
    for (int l = first_layer; l < first_layer + n_layers; ++l) {
      for (int e = 0; e < n_experts_; ++e) {
        ExpertLocation loc = locate_expert(ck, l, e);
        uint64_t offsets[6], total = 0;
        for (int i = 0; i < 6; ++i) {
          offsets[i] = total;
          total += (loc.parts[i].bytes + 63) / 64 * 64;
        }
        Slot& s = experts_[index(l, e)];
        s.buffer = AlignedBuffer(total);
        for (int i = 0; i < 6; ++i)
          reader.read(loc.parts[i].shard->file(), s.buffer.data() + offsets[i], loc.parts[i].bytes, loc.parts[i].offset);
        s.weights = expert_views(ck, s.buffer.data(), offsets);
        int part = 0;
        const std::string problem = expert_scale_problem(c, l, e, s.weights, &part);
        if (!problem.empty()) fail("expert {} of layer {}: {}: {}", e, l, loc.parts[part].shard->path(), problem);
        bytes_ += total;
      }
    }
  }

  void prefetch(int, std::span<const int>) override {}
  const ExpertWeights& acquire(int layer, int expert) override {
    // Atomic: with several slots generating, another thread reads the counts during a pass.
    requests_.fetch_add(1, std::memory_order_relaxed);
    return experts_[index(layer, expert)].weights;
  }
  void release(int, int) override {}
  ExpertStats stats() const override {
    ExpertStats s;
    s.requests = s.hits = requests_.load(std::memory_order_relaxed);
    return s;
  }
  uint64_t resident_bytes() const override { return bytes_; }

 private:
  struct Slot {
    AlignedBuffer buffer;
    ExpertWeights weights;
  };
  size_t index(int layer, int expert) const { return static_cast<size_t>(layer - first_layer_) * n_experts_ + expert; }

  int first_layer_ = 0;
  int n_experts_ = 0;
  std::vector<Slot> experts_;
  uint64_t bytes_ = 0;
  std::atomic<uint64_t> requests_{0};  // every request is a hit
};

}  // namespace

std::unique_ptr<ExpertProvider> make_resident_experts(const Checkpoint& ck, IoFaults* faults) {
  return std::make_unique<ResidentExperts>(ck, 0, ck.config().num_layers, faults);
}

std::unique_ptr<ExpertProvider> make_resident_experts(const Checkpoint& ck, int first_layer, int n_layers,
                                                      IoFaults* faults) {
  return std::make_unique<ResidentExperts>(ck, first_layer, n_layers, faults);
}

}  // namespace dsv4
