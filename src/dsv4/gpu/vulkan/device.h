// The Vulkan instance, the physical device chosen for --gpu, the logical device with one
// compute queue, and (tests) the validation layer with a debug messenger.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/gpu/backend.h"

namespace dsv4::gpu::vulkan {

// A Vulkan create-info struct, zeroed, with its sType.
template <typename T>
T make_info(VkStructureType type) {
  T v{};
  v.sType = type;
  return v;
}

// Throws Error("vulkan: <what>: VK_ERROR_...") unless r is VK_SUCCESS.
void check(VkResult r, const char* what);
const char* result_name(VkResult r);

class Device {
 public:
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // nullptr with *why_not set when the selection names no usable device.
  static std::unique_ptr<Device> create(const OpenOptions& options, std::string* why_not);

  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  VkQueue queue() const { return queue_; }
  const VkPhysicalDeviceProperties& properties() const { return props_; }
  const VkPhysicalDeviceMemoryProperties& memory() const { return memory_; }
  // The device-local heap's size (the largest heap with VK_MEMORY_HEAP_DEVICE_LOCAL_BIT).
  uint64_t device_local_bytes() const;
  // A memory type in `type_bits` with all of `flags`, or -1.
  int memory_type(uint32_t type_bits, VkMemoryPropertyFlags flags) const;

  // Records `record` into a one-time command buffer, submits it and waits for it.
  void run(const std::function<void(VkCommandBuffer)>& record);

 private:
  Device() = default;
  static VKAPI_ATTR VkBool32 VKAPI_CALL on_debug(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                 VkDebugUtilsMessageTypeFlagsEXT types,
                                                 const VkDebugUtilsMessengerCallbackDataEXT* data, void* user);

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props_{};
  VkPhysicalDeviceMemoryProperties memory_{};
  std::function<void(const std::string&)> on_message_;
};

// "llvmpipe (LLVM 15.0.6, 256 bits), cpu, 2.0 GiB" for each device with a compute queue.
std::vector<std::string> device_names(std::string* why_not);

}  // namespace dsv4::gpu::vulkan
