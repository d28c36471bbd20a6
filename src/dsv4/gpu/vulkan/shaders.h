// The compute shaders of src/dsv4/gpu/shaders/, compiled by glslc at build time and embedded
// here as SPIR-V words (CMakeLists.txt).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv4::gpu::vulkan {

struct Spirv {
  const uint32_t* words;
  size_t count;
};

enum class Shader : uint8_t { kMatmulFloat, kMatmulInt, kRmsNorm };
inline constexpr int kShaderCount = 3;

Spirv shader_code(Shader s);

}  // namespace dsv4::gpu::vulkan
