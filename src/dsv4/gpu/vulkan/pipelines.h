// One compute pipeline per shader: its descriptor layout (storage buffers at bindings 0..N-1),
// push constants, and a dispatch that binds buffers and runs synchronously.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <initializer_list>

#include "dsv4/gpu/vulkan/buffers.h"
#include "dsv4/gpu/vulkan/device.h"
#include "dsv4/gpu/vulkan/shaders.h"

namespace dsv4::gpu::vulkan {

class Pipeline {
 public:
  Pipeline(Device& device, Shader shader, uint32_t buffers, uint32_t push_bytes);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Binds `buffers` in binding order, pushes `push` (push_bytes of it), dispatches
  // groups_x * groups_y workgroups, and waits for the result.
  void dispatch(std::initializer_list<const Buffer*> buffers, const void* push, uint32_t groups_x, uint32_t groups_y);

 private:
  Device& device_;
  uint32_t buffers_, push_bytes_;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
};

}  // namespace dsv4::gpu::vulkan
