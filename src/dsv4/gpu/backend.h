// The GPU tier's one interface (issue 45). The engine talks only to gpu::Backend; the Vulkan
// implementation lives under src/dsv4/gpu/vulkan/ (a file per concern: device, buffers,
// pipelines, kernels) with its GLSL shaders in src/dsv4/gpu/shaders/, and a CUDA or Metal
// backend would implement the same class without touching the model.
//
// Weights are uploaded once, in their checkpoint formats (FP4 E2M1 + UE8M0, FP8 E4M3 + UE8M0,
// BF16, F32): the device never holds a widened copy. Every product has the definition of
// kernels::matmul (kernels.h) in both numerics; docs/numerics.md ("GPU tier") says which
// operations give the CPU's bits exactly and which stay within a stated tolerance.
//
// This first slice runs one operation per call (upload, compute, read back). A layer's dense
// work as one recorded command stream, the KV cache in VRAM and the routed experts' split
// between GPU and CPU build on these calls; none of it is wired into the forward pass yet.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/kernels/kernels.h"

namespace dsv4::gpu {

// --gpu auto|off|N and --gpu-mem SIZE (src/dsv4/runtime/settings.cc declares both).
struct Selection {
  enum class Mode : uint8_t { kAuto, kOff, kIndex };
  Mode mode = Mode::kAuto;
  int index = -1;              // kIndex: the device number `dsv4 settings` lists
  uint64_t memory_limit = 0;   // bytes of device memory the tier may use; 0 = all of it
};
// Parses the --gpu text ("auto", "off" or a device number); throws Error naming `source`.
Selection parse_selection(const std::string& gpu, uint64_t gpu_mem, const std::string& source = "--gpu");

struct OpenOptions {
  Selection selection;
  // Vulkan: enable VK_LAYER_KHRONOS_validation and report every message it prints to
  // `on_message` (tests fail on any). Without the layer installed, open() fails and says so.
  bool validation = false;
  std::function<void(const std::string&)> on_message;
};

// A weight or vector held in device memory (index into the backend's table).
using BufferId = int32_t;
inline constexpr BufferId kNoBuffer = -1;

class Backend {
 public:
  virtual ~Backend() = default;

  // "vulkan: llvmpipe (LLVM 15.0.6, 256 bits), 2.0 GiB" and whether it is a CPU device (lavapipe:
  // correct results, but its timings are not GPU performance figures).
  virtual std::string description() const = 0;
  virtual bool is_cpu_device() const = 0;
  virtual uint64_t memory_limit() const = 0;
  virtual uint64_t memory_used() const = 0;

  // Uploads a matrix once, in its own format (data and scales as stored). Throws Error when it
  // does not fit the memory limit (naming the numbers).
  virtual BufferId upload(const kernels::Matrix& w) = 0;
  // A float vector (norm weights).
  virtual BufferId upload(const float* v, int64_t n) = 0;
  virtual void release(BufferId id) = 0;

  // y[i * y_stride + r] = sum_c W[r, c] * x[i * cols + c] for i < n, r < rows: the product of
  // kernels::matmul, in `numerics`. x is read from, and y written to, host memory.
  virtual void matmul(BufferId w, const float* x, int64_t n, float* y, kernels::Numerics numerics,
                      int64_t y_stride = 0) = 0;
  // ops::rms_norm_rows: out[r] = weight * (x[r] * rsqrt(mean(x[r]^2) + eps)) for r < rows;
  // weight == kNoBuffer: unweighted.
  virtual void rms_norm(const float* x, BufferId weight, int64_t rows, int64_t n, float eps, float* out) = 0;
};

// Opens the device `options.selection` names. nullptr with *why_not set when there is none
// (not built with Vulkan, no driver, no device, --gpu off, index out of range).
std::unique_ptr<Backend> open(const OpenOptions& options, std::string* why_not);

// The devices this machine offers the tier, in --gpu N order ("" and *why_not set if none).
std::vector<std::string> list_devices(std::string* why_not);
// One line for `dsv4 settings`: the tier's build status and the devices found, or why none.
std::string describe();

}  // namespace dsv4::gpu
