#include "dsv4/gpu/vulkan/shaders.h"

namespace dsv4::gpu::vulkan {
namespace {

const uint32_t kMatmulFloat[] = {
#include "matmul_float.spv.inc"
};
const uint32_t kMatmulInt[] = {
#include "matmul_int.spv.inc"
};
const uint32_t kRmsNorm[] = {
#include "rms_norm.spv.inc"
};

template <size_t N>
Spirv of(const uint32_t (&a)[N]) {
  return {a, N};
}

}  // namespace

Spirv shader_code(Shader s) {
  switch (s) {
    case Shader::kMatmulFloat: return of(kMatmulFloat);
    case Shader::kMatmulInt: return of(kMatmulInt);
    case Shader::kRmsNorm: return of(kRmsNorm);
  }
  return {nullptr, 0};
}

}  // namespace dsv4::gpu::vulkan
