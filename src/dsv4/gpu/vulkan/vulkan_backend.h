// The Vulkan implementation of gpu::Backend (the kernels: which pipeline each operation runs,
// with which buffers and push constants).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsv4/gpu/backend.h"

namespace dsv4::gpu::vulkan {

std::unique_ptr<Backend> open_backend(const OpenOptions& options, std::string* why_not);
std::vector<std::string> list_devices(std::string* why_not);

}  // namespace dsv4::gpu::vulkan
