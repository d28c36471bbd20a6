// dsv4 bench kernels: matmul speed at DeepSeek V4 Flash shapes, next to the machine's own limits
// (DRAM read bandwidth, FP32 FMA peak) measured in the same run. Buffers live in memory only.
//
// n = 1 is decode: the weights must come from DRAM, so the run cycles over enough distinct
// copies of the matrix (>= 256 MiB) that nothing stays in the last-level cache. n >= 16 is
// prefill: one matrix, compute-bound.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/bench/bench.h"
#include "dsv4/kernels/formats.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/bench/machine_limits.h"
#include "dsv4/platform/platform.h"
#include "dsv4/util/error.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4::cli {
namespace {

using kernels::Matrix;
using kernels::Numerics;
using kernels::WeightFormat;

struct Shape {
  const char* name;
  WeightFormat format;
  int64_t rows, cols;
};

const Shape kShapes[] = {
    {"expert w1/w3", WeightFormat::kFP4, 2048, 4096},
    {"expert w2", WeightFormat::kFP4, 4096, 2048},
    {"attn wq_b", WeightFormat::kFP8, 32768, 1024},
    {"attn wo_b", WeightFormat::kFP8, 4096, 8192},
    {"head", WeightFormat::kBF16, 129280, 4096},
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// FP8 codes distributed as in an official checkpoint: Gaussian weights quantized to E4M3 with
// each block's largest magnitude near 448 (sigma ~107), so E4M3 subnormals are as rare as there
// (~1e-4; uniformly random codes would make 6 % of them subnormal). 65536 samples, drawn from
// by index.
const std::vector<uint8_t>& fp8_code_samples() {
  static const std::vector<uint8_t> codes = [] {
    std::vector<float> value(127);
    for (int c = 0; c < 127; ++c) value[c] = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 107.0f);
    std::vector<uint8_t> out(65536);
    for (auto& code : out) {
      const float v = g(rng), a = std::min(std::fabs(v), 448.0f);
      int c = static_cast<int>(std::upper_bound(value.begin(), value.end(), a) - value.begin()) - 1;
      if (c < 126 && value[c + 1] - a < a - value[c]) ++c;
      code = static_cast<uint8_t>(c | (v < 0 ? 0x80 : 0));
    }
    return out;
  }();
  return codes;
}

// One matrix's storage, filled with codes like a real checkpoint's (FP8 as above, random FP4
// nibbles, no NaN codes, scales around 2^-5).
struct Storage {
  std::unique_ptr<uint8_t[]> data, scales;
  Matrix m;
};

Storage make(const Shape& s, uint64_t seed) {
  Storage st;
  st.m.format = s.format;
  st.m.rows = s.rows;
  st.m.cols = s.cols;
  int64_t db = st.m.data_bytes(), sb = st.m.scale_bytes();
  st.data.reset(new uint8_t[static_cast<size_t>(db)]);
  std::mt19937_64 rng(seed);
  uint64_t* p = reinterpret_cast<uint64_t*>(st.data.get());
  for (int64_t k = 0; k < db / 8; ++k) p[k] = rng();
  if (s.format == WeightFormat::kFP8) {
    const std::vector<uint8_t>& codes = fp8_code_samples();
    for (int64_t k = 0; k < db; k += 4) {
      const uint64_t r = rng();
      for (int64_t j = 0; j < 4 && k + j < db; ++j) st.data[k + j] = codes[(r >> (16 * j)) & 0xffff];
    }
  } else if (s.format == WeightFormat::kBF16) {
    // Random bits would include NaNs and huge values; keep a plausible bf16 range.
    uint16_t* h = reinterpret_cast<uint16_t*>(st.data.get());
    for (int64_t k = 0; k < db / 2; ++k) h[k] = static_cast<uint16_t>(0x3c00 | (h[k] & 0x83ff));
  }
  if (sb) {
    st.scales.reset(new uint8_t[static_cast<size_t>(sb)]);
    for (int64_t k = 0; k < sb; ++k) st.scales[k] = static_cast<uint8_t>(118 + rng() % 9);
  }
  st.m.data = st.data.get();
  st.m.scales = st.scales.get();
  return st;
}

struct Row {
  const Shape* shape;
  int64_t n;
  Numerics mode;
  double seconds;  // median per matmul call
  double weight_gbps, gflops;
  double dram_gbps, fma_gflops;  // measured right before this case
};

}  // namespace

int bench_kernels(const BenchKernelsOptions& o) {
  // --n, --format, --mode and --threads were parsed and range-checked by the settings table.
  const std::vector<int64_t>& ns = o.n;
  const std::vector<std::string>& formats = o.formats;
  std::vector<Numerics> modes;
  if (o.mode == "fast" || o.mode == "both") modes.push_back(Numerics::kFast);
  if (o.mode == "reference" || o.mode == "both") modes.push_back(Numerics::kReference);
  int threads = o.threads > 0 ? o.threads : available_cpus();
  ThreadPool pool(threads);
  const std::string path = kernels::active_path(), tuning = kernels::active_tuning();

  if (!o.json) {
    std::printf("dsv4 bench kernels: path %s%s%s%s, %d threads; measuring machine limits...\n", path.c_str(),
                tuning.empty() ? "" : " (", tuning.c_str(), tuning.empty() ? "" : ")", threads);
  }
  kernels::MachineLimits lim = kernels::measure_machine_limits(&pool);
  if (!o.json) {
    double load[3] = {0, 0, 0};
    if (!platform::load_average(load)) load[0] = -1;
    std::printf("machine: DRAM read %.1f GB/s, FP32 FMA peak %.0f GFLOP/s (%s width, %d threads, medians); "
                "load average %.2f\n\n",
                lim.dram_read_gbps, lim.fma_gflops, path.c_str(), threads, load[0]);
  }

  std::vector<Row> rows;
  kernels::QuantizedInput scratch;  // as a forward pass keeps one: no allocation per timed call
  if (!o.json)
    std::printf("%-13s %-5s %13s %4s %-9s %10s %9s %9s %7s %7s %6s %5s\n", "matrix", "fmt", "rows x cols", "n",
                "mode", "ms/call", "weight GB/s", "GFLOP/s", "%DRAM", "%FMA", "DRAM", "FMA");
  for (const Shape& s : kShapes) {
    if (!formats.empty() && std::find(formats.begin(), formats.end(), kernels::format_name(s.format)) == formats.end())
      continue;
    const int64_t wbytes = Matrix{s.format, s.rows, s.cols, nullptr, nullptr}.data_bytes() +
                           Matrix{s.format, s.rows, s.cols, nullptr, nullptr}.scale_bytes();
    // Decode needs DRAM-resident weights: enough distinct copies to exceed any last-level cache.
    const int64_t copies_dram = std::max<int64_t>(1, std::min<int64_t>(64, (int64_t{256} << 20) / wbytes + 1));
    std::vector<Storage> mats;
    for (int64_t n : ns) {
      const int64_t copies = n == 1 ? copies_dram : 1;
      while (static_cast<int64_t>(mats.size()) < copies) mats.push_back(make(s, 1000 + mats.size()));
      std::vector<float> x(static_cast<size_t>(n * s.cols)), y(static_cast<size_t>(n * s.rows));
      std::mt19937 rng(7);
      std::normal_distribution<float> g(0.0f, 1.0f);
      for (auto& v : x) v = g(rng);
      for (Numerics mode : modes) {
        // Warm up, then time passes over the copies for --seconds (at least 5 passes).
        for (int64_t c = 0; c < copies; ++c) kernels::matmul(mats[c].m, x.data(), n, y.data(), mode, &pool, 0, &scratch);
        std::vector<double> per_call;
        double start = now();
        while (per_call.size() < 5 || (now() - start < o.seconds && per_call.size() < 200)) {
          double t0 = now();
          for (int64_t c = 0; c < copies; ++c) kernels::matmul(mats[c].m, x.data(), n, y.data(), mode, &pool, 0, &scratch);
          per_call.push_back((now() - t0) / copies);
        }
        std::sort(per_call.begin(), per_call.end());
        double sec = per_call[per_call.size() / 2];
        // The machine is shared: its limits move from minute to minute, so each case is set
        // against limits measured right after it.
        double dram = kernels::measure_dram_read_gbps(&pool, int64_t{256} << 20, 3);
        double fma = kernels::measure_fma_gflops(&pool, 3);
        Row r{&s, n, mode, sec, wbytes / sec / 1e9, 2.0 * s.rows * s.cols * n / sec / 1e9, dram, fma};
        rows.push_back(r);
        if (!o.json) {
          std::printf("%-13s %-5s %6lld x %-5lld %4lld %-9s %10.3f %9.1f %9.1f %6.0f%% %6.0f%% %6.1f %5.0f\n", s.name,
                      kernels::format_name(s.format), static_cast<long long>(s.rows), static_cast<long long>(s.cols),
                      static_cast<long long>(n), kernels::numerics_name(mode), sec * 1e3, r.weight_gbps, r.gflops,
                      100.0 * r.weight_gbps / r.dram_gbps, 100.0 * r.gflops / r.fma_gflops, r.dram_gbps,
                      r.fma_gflops);
          std::fflush(stdout);
        }
      }
    }
  }
  if (o.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json j;
      j["format"] = kernels::format_name(r.shape->format);
      j["rows"] = r.shape->rows;
      j["cols"] = r.shape->cols;
      j["n"] = r.n;
      j["mode"] = kernels::numerics_name(r.mode);
      j["path"] = path;
      j["tuning"] = tuning;
      j["seconds"] = r.seconds;
      j["weight_gbps"] = r.weight_gbps;
      j["gflops"] = r.gflops;
      j["dram_gbps"] = r.dram_gbps;
      j["fma_gflops"] = r.fma_gflops;
      out.push_back(j);
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("\nweight GB/s counts packed weights + scales; n=1 streams >= 256 MiB of distinct copies from DRAM.\n"
                "%%DRAM and %%FMA are against limits re-measured right after each case (start of run: DRAM %.1f GB/s, "
                "FMA %.0f GFLOP/s).\n",
                lim.dram_read_gbps, lim.fma_gflops);
  }
  return 0;
}

}  // namespace dsv4::cli
