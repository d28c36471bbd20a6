// The backend-independent part of the GPU tier: the --gpu selection and the settings line.
// Built with or without Vulkan; without it every open() answers why.
#include "dsv4/gpu/backend.h"

#include <charconv>

#include "dsv4/util/error.h"

#ifdef DSV4_HAVE_VULKAN
#include "dsv4/gpu/vulkan/vulkan_backend.h"
#endif

#ifndef DSV4_VULKAN_STATUS
#define DSV4_VULKAN_STATUS "not built"
#endif

namespace dsv4::gpu {

Selection parse_selection(const std::string& gpu, uint64_t gpu_mem, const std::string& source) {
  Selection s;
  s.memory_limit = gpu_mem;
  if (gpu == "auto" || gpu.empty()) return s;
  if (gpu == "off") {
    s.mode = Selection::Mode::kOff;
    return s;
  }
  int index = -1;
  const auto [end, ec] = std::from_chars(gpu.data(), gpu.data() + gpu.size(), index);
  if (ec != std::errc() || end != gpu.data() + gpu.size() || index < 0)
    fail("{} '{}': expected auto, off or a device number (dsv4 settings lists the devices)", source, gpu);
  s.mode = Selection::Mode::kIndex;
  s.index = index;
  return s;
}

std::unique_ptr<Backend> open(const OpenOptions& options, std::string* why_not) {
  if (options.selection.mode == Selection::Mode::kOff) {
    *why_not = "--gpu off";
    return nullptr;
  }
#ifdef DSV4_HAVE_VULKAN
  return vulkan::open_backend(options, why_not);
#else
  *why_not = "GPU tier " DSV4_VULKAN_STATUS;
  return nullptr;
#endif
}

std::vector<std::string> list_devices(std::string* why_not) {
#ifdef DSV4_HAVE_VULKAN
  return vulkan::list_devices(why_not);
#else
  *why_not = "GPU tier " DSV4_VULKAN_STATUS;
  return {};
#endif
}

std::string describe() {
  std::string why;
  const std::vector<std::string> devices = list_devices(&why);
  if (devices.empty()) return "gpu: none (" + why + "); the engine runs on the CPU";
  std::string out = "gpu: Vulkan tier " DSV4_VULKAN_STATUS "; devices (--gpu N):";
  for (size_t i = 0; i < devices.size(); ++i) out += fmt::format(" {}: {}{}", i, devices[i], i + 1 < devices.size() ? ";" : "");
  return out;
}

}  // namespace dsv4::gpu
