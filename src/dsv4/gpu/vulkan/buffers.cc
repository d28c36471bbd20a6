#include "dsv4/gpu/vulkan/buffers.h"

#include <cstring>
#include <utility>
#include <vector>

#include "dsv4/util/error.h"

namespace dsv4::gpu::vulkan {

Buffer::Buffer(Device& device, uint64_t bytes, Place place) : device_(&device) {
  bytes_ = bytes < 4 ? 4 : (bytes + 3) / 4 * 4;
  auto bi = make_info<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bi.size = bytes_;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(vkCreateBuffer(device.handle(), &bi, nullptr, &buffer_), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device.handle(), buffer_, &req);
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int type = -1;
  if (place == Place::kDevice) {
    type = device.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  } else {
    type = device.memory_type(req.memoryTypeBits, host | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    if (type < 0) type = device.memory_type(req.memoryTypeBits, host);
  }
  if (type < 0) type = device.memory_type(req.memoryTypeBits, host);
  if (type < 0) {
    reset();
    fail("vulkan: no memory type for a {}-byte buffer", bytes_);
  }
  auto ai = make_info<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = static_cast<uint32_t>(type);
  const VkResult r = vkAllocateMemory(device.handle(), &ai, nullptr, &memory_);
  if (r != VK_SUCCESS) {
    reset();
    check(r, "vkAllocateMemory");
  }
  check(vkBindBufferMemory(device.handle(), buffer_, memory_, 0), "vkBindBufferMemory");
  const VkMemoryPropertyFlags flags = device.memory().memoryTypes[type].propertyFlags;
  if ((flags & host) == host) check(vkMapMemory(device.handle(), memory_, 0, VK_WHOLE_SIZE, 0, &mapped_), "vkMapMemory");
}

Buffer::~Buffer() { reset(); }

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::exchange(o.device_, nullptr);
    buffer_ = std::exchange(o.buffer_, VK_NULL_HANDLE);
    memory_ = std::exchange(o.memory_, VK_NULL_HANDLE);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, nullptr);
  }
  return *this;
}

void Buffer::reset() {
  if (!device_) return;
  if (mapped_) vkUnmapMemory(device_->handle(), memory_);
  if (buffer_) vkDestroyBuffer(device_->handle(), buffer_, nullptr);
  if (memory_) vkFreeMemory(device_->handle(), memory_, nullptr);
  mapped_ = nullptr;
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  bytes_ = 0;
}

void Buffer::write(const void* src, uint64_t bytes, uint64_t offset) {
  if (offset + bytes > bytes_) fail("vulkan: write of {} bytes at {} into a {}-byte buffer", bytes, offset, bytes_);
  if (bytes == 0) return;
  if (mapped_) {
    std::memcpy(static_cast<char*>(mapped_) + offset, src, bytes);
    return;
  }
  // Staging: a host buffer copied in on the device (vkCmdCopyBuffer needs no alignment).
  Buffer staging(*device_, bytes, Place::kHost);
  staging.write(src, bytes);
  device_->run([&](VkCommandBuffer cb) {
    VkBufferCopy region{0, offset, bytes};
    vkCmdCopyBuffer(cb, staging.handle(), buffer_, 1, &region);
    auto mb = make_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr,
                         0, nullptr);
  });
}

void Buffer::read(void* dst, uint64_t bytes) const {
  if (bytes > bytes_) fail("vulkan: read of {} bytes from a {}-byte buffer", bytes, bytes_);
  if (!mapped_) fail("vulkan: read from a buffer that is not host-visible");
  std::memcpy(dst, mapped_, bytes);
}

void Buffer::zero() {
  if (mapped_) {
    std::memset(mapped_, 0, bytes_);
    return;
  }
  device_->run([&](VkCommandBuffer cb) {
    vkCmdFillBuffer(cb, buffer_, 0, bytes_, 0);
    auto mb = make_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr,
                         0, nullptr);
  });
}

}  // namespace dsv4::gpu::vulkan
