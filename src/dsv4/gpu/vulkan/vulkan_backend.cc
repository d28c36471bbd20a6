#include "dsv4/gpu/vulkan/vulkan_backend.h"

#include <algorithm>
#include <optional>

#include "dsv4/gpu/vulkan/buffers.h"
#include "dsv4/gpu/vulkan/device.h"
#include "dsv4/gpu/vulkan/pipelines.h"
#include "dsv4/kernels/kernels_internal.h"
#include "dsv4/util/error.h"

namespace dsv4::gpu::vulkan {
namespace {

using kernels::Matrix;
using kernels::Numerics;
using kernels::WeightFormat;

// Activation rows per workgroup (the shaders' 8 x 8 invocation layout).
constexpr int64_t kRowsPerGroup = 8;

struct PushMatmul {
  uint32_t rows, cols, n, format, y_stride;
};
struct PushNorm {
  uint32_t n, has_weight;
  float eps;
};

uint32_t format_code(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return 0;
    case WeightFormat::kBF16: return 1;
    case WeightFormat::kFP8: return 2;
    case WeightFormat::kFP4: return 3;
  }
  return 0;
}

// Shaders index with 32-bit integers.
uint32_t u32(int64_t v, const char* what) {
  if (v < 0 || v > int64_t{0xffffffff}) fail("vulkan: {} {} does not fit the shaders' 32-bit indices", what, v);
  return static_cast<uint32_t>(v);
}

class VulkanBackend final : public Backend {
 public:
  VulkanBackend(std::unique_ptr<Device> device, uint64_t limit)
      : device_(std::move(device)),
        limit_(limit),
        float_mm_(*device_, Shader::kMatmulFloat, 4, sizeof(PushMatmul)),
        int_mm_(*device_, Shader::kMatmulInt, 5, sizeof(PushMatmul)),
        norm_(*device_, Shader::kRmsNorm, 3, sizeof(PushNorm)),
        empty_(*device_, 4, Buffer::Place::kDevice) {
    empty_.zero();
  }

  std::string description() const override {
    const auto& p = device_->properties();
    return fmt::format("vulkan: {}, {:.1f} of {:.1f} GiB{}", p.deviceName, static_cast<double>(limit_) / (1 << 30),
                       static_cast<double>(device_->device_local_bytes()) / (1 << 30),
                       is_cpu_device() ? " (a CPU device: correct, but its timings are not GPU figures)" : "");
  }
  bool is_cpu_device() const override { return device_->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU; }
  uint64_t memory_limit() const override { return limit_; }
  uint64_t memory_used() const override { return used_; }

  BufferId upload(const Matrix& w) override {
    if (w.rows <= 0 || w.cols <= 0) fail("vulkan: upload of an empty {} matrix [{}, {}]", kernels::format_name(w.format), w.rows, w.cols);
    if (!w.data) fail("vulkan: {} matrix [{}, {}] has no data", kernels::format_name(w.format), w.rows, w.cols);
    if (w.format == WeightFormat::kFP4 && (w.cols & 1)) fail("vulkan: fp4 matrix [{}, {}] needs an even column count", w.rows, w.cols);
    const bool scaled = w.format == WeightFormat::kFP8 || w.format == WeightFormat::kFP4;
    if (scaled && !w.scales) fail("vulkan: {} matrix [{}, {}] has no scales", kernels::format_name(w.format), w.rows, w.cols);
    u32(w.data_bytes(), "matrix bytes");
    const uint64_t bytes = static_cast<uint64_t>(w.data_bytes()) + static_cast<uint64_t>(w.scale_bytes());
    reserve(bytes, kernels::format_name(w.format));
    Entry e;
    e.matrix = w;
    e.data = Buffer(*device_, static_cast<uint64_t>(w.data_bytes()), Buffer::Place::kDevice);
    e.data.write(w.data, static_cast<uint64_t>(w.data_bytes()));
    if (scaled) {
      e.scales = Buffer(*device_, static_cast<uint64_t>(w.scale_bytes()), Buffer::Place::kDevice);
      e.scales.write(w.scales, static_cast<uint64_t>(w.scale_bytes()));
    }
    e.bytes = bytes;
    return store(std::move(e));
  }

  BufferId upload(const float* v, int64_t n) override {
    Matrix m;
    m.format = WeightFormat::kF32;
    m.rows = 1;
    m.cols = n;
    m.data = v;
    return upload(m);
  }

  void release(BufferId id) override {
    Entry& e = entry(id);
    used_ -= e.bytes;
    entries_[static_cast<size_t>(id)].reset();
  }

  void matmul(BufferId id, const float* x, int64_t n, float* y, Numerics numerics, int64_t y_stride) override {
    const Entry& e = entry(id);
    const Matrix& w = e.matrix;
    if (y_stride == 0) y_stride = w.rows;
    if (y_stride < w.rows) fail("vulkan: y_stride {} < rows {}", y_stride, w.rows);
    if (n <= 0) return;
    const int64_t out_floats = (n - 1) * y_stride + w.rows;
    Buffer& yb = scratch(y_buf_, static_cast<uint64_t>(out_floats) * 4);
    // y's gaps between rows keep the caller's values: the shader writes only y[i, r < rows].
    if (y_stride != w.rows) yb.write(y, static_cast<uint64_t>(out_floats) * 4);
    const PushMatmul push{u32(w.rows, "rows"), u32(w.cols, "cols"), u32(n, "activation rows"), format_code(w.format),
                          u32(y_stride, "y_stride")};
    u32(n * (ceil_cols(w.cols) + 8), "activation elements");
    const Buffer& scales = e.scales.valid() ? e.scales : empty_;
    const uint32_t groups_y = u32(kernels::detail::ceil_div(n, kRowsPerGroup), "activation groups");
    if (kernels::uses_quantized_input(w, numerics)) {
      // The activations quantized as the CPU does it (same function, same bits), then Q in
      // natural column order, zero padded to whole 32-column blocks.
      kernels::prepare_input(x, n, w.cols, Numerics::kFast, &quant_, nullptr);
      const int64_t nb = kernels::detail::ceil_div(w.cols, kernels::detail::kQBlock), qcols = nb * kernels::detail::kQBlock;
      q_host_.assign(static_cast<size_t>(n * qcols), 0);
      for (int64_t i = 0; i < n; ++i) {
        const int8_t* hi = quant_.q.data() + i * quant_.padded_cols;
        const int8_t* lo = quant_.ql.data() + i * quant_.padded_cols;
        for (int64_t c = 0; c < w.cols; ++c) {
          const int64_t p = kernels::detail::span_pos(c);
          q_host_[static_cast<size_t>(i * qcols + c)] = 256 * hi[p] + lo[p];
        }
      }
      Buffer& qb = scratch(q_buf_, q_host_.size() * 4);
      qb.write(q_host_.data(), q_host_.size() * 4);
      Buffer& db = scratch(d_buf_, quant_.d.size() * 4);
      db.write(quant_.d.data(), static_cast<uint64_t>(n * nb) * 4);
      int_mm_.dispatch({&e.data, &scales, &qb, &db, &yb}, &push, push.rows, groups_y);
    } else {
      Buffer& xb = scratch(x_buf_, static_cast<uint64_t>(n * w.cols) * 4);
      xb.write(x, static_cast<uint64_t>(n * w.cols) * 4);
      float_mm_.dispatch({&e.data, &scales, &xb, &yb}, &push, push.rows, groups_y);
    }
    yb.read(y, static_cast<uint64_t>(out_floats) * 4);
  }

  void rms_norm(const float* x, BufferId weight, int64_t rows, int64_t n, float eps, float* out) override {
    if (rows <= 0 || n <= 0) return;
    const Buffer* wb = &empty_;
    if (weight != kNoBuffer) {
      const Entry& e = entry(weight);
      if (e.matrix.format != WeightFormat::kF32 || e.matrix.rows * e.matrix.cols != n)
        fail("vulkan: rms_norm weight {} is not a float vector of {}", weight, n);
      wb = &e.data;
    }
    const uint64_t bytes = static_cast<uint64_t>(rows * n) * 4;
    Buffer& xb = scratch(x_buf_, bytes);
    xb.write(x, bytes);
    Buffer& ob = scratch(y_buf_, bytes);
    const PushNorm push{u32(n, "norm width"), weight != kNoBuffer ? 1u : 0u, eps};
    norm_.dispatch({&xb, wb, &ob}, &push, u32(rows, "norm rows"), 1);
    ob.read(out, bytes);
  }

 private:
  struct Entry {
    Matrix matrix;
    Buffer data, scales;
    uint64_t bytes = 0;
  };

  static int64_t ceil_cols(int64_t cols) { return kernels::detail::ceil_div(cols, kernels::detail::kQBlock) * kernels::detail::kQBlock; }

  void reserve(uint64_t bytes, const char* what) {
    if (used_ + bytes > limit_)
      fail("vulkan: a {} weight of {} bytes does not fit: {} of the {}-byte limit (--gpu-mem) are in use", what, bytes,
           used_, limit_);
    used_ += bytes;
  }

  BufferId store(Entry e) {
    entries_.push_back(std::move(e));
    return static_cast<BufferId>(entries_.size() - 1);
  }

  Entry& entry(BufferId id) {
    if (id < 0 || static_cast<size_t>(id) >= entries_.size() || !entries_[static_cast<size_t>(id)])
      fail("vulkan: no buffer {}", id);
    return *entries_[static_cast<size_t>(id)];
  }

  // A host-visible buffer of at least `bytes`, grown (never shrunk) as calls need.
  Buffer& scratch(Buffer& b, uint64_t bytes) {
    if (!b.valid() || b.bytes() < bytes) b = Buffer(*device_, std::max<uint64_t>(bytes, 256), Buffer::Place::kHost);
    return b;
  }

  std::unique_ptr<Device> device_;
  uint64_t limit_ = 0, used_ = 0;
  std::vector<std::optional<Entry>> entries_;
  Pipeline float_mm_, int_mm_, norm_;
  Buffer empty_;                     // bound where a shader's buffer is unused (no scales, no norm weight)
  Buffer x_buf_, q_buf_, d_buf_, y_buf_;
  kernels::QuantizedInput quant_;
  std::vector<int32_t> q_host_;
};

}  // namespace

std::unique_ptr<Backend> open_backend(const OpenOptions& options, std::string* why_not) {
  std::unique_ptr<Device> device = Device::create(options, why_not);
  if (!device) return nullptr;
  const uint64_t total = device->device_local_bytes();
  uint64_t limit = options.selection.memory_limit;
  if (limit == 0) limit = total;
  if (limit > total) {
    *why_not = fmt::format("--gpu-mem {} bytes is more than the {} bytes of {}", limit, total, device->properties().deviceName);
    return nullptr;
  }
  return std::make_unique<VulkanBackend>(std::move(device), limit);
}

std::vector<std::string> list_devices(std::string* why_not) { return device_names(why_not); }

}  // namespace dsv4::gpu::vulkan
