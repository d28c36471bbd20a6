// Storage buffers: weights in device-local memory (uploaded through a staging buffer when the
// device memory is not host-visible), activations and results in host-visible memory.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>

#include "dsv4/gpu/vulkan/device.h"

namespace dsv4::gpu::vulkan {

class Buffer {
 public:
  enum class Place : uint8_t { kDevice, kHost };

  Buffer() = default;
  // `bytes` is rounded up to a multiple of 4 (shaders read 32-bit words); at least 4.
  Buffer(Device& device, uint64_t bytes, Place place);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  VkBuffer handle() const { return buffer_; }
  uint64_t bytes() const { return bytes_; }
  bool valid() const { return buffer_ != VK_NULL_HANDLE; }

  // Copies host bytes in at `offset` (through a staging buffer if this one is not mapped);
  // the rest of the buffer is left as it is.
  void write(const void* src, uint64_t bytes, uint64_t offset = 0);
  // Copies bytes out (mapped buffers only: results live in host-visible memory).
  void read(void* dst, uint64_t bytes) const;
  // Sets the whole buffer to zero bytes.
  void zero();

 private:
  void reset();

  Device* device_ = nullptr;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint64_t bytes_ = 0;
  void* mapped_ = nullptr;
};

}  // namespace dsv4::gpu::vulkan
