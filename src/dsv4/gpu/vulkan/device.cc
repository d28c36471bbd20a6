#include "dsv4/gpu/vulkan/device.h"

#include <cstring>

#include "dsv4/util/error.h"

namespace dsv4::gpu::vulkan {
namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

// An instance for compute only: no surface extensions.
VkResult make_instance(bool validation, VkInstance* out) {
  auto app = make_info<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "dsv4";
  app.pEngineName = "dsv4";
  app.apiVersion = VK_API_VERSION_1_2;
  auto ci = make_info<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ci.pApplicationInfo = &app;
  const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
  if (validation) {
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = &kValidationLayer;
    ci.enabledExtensionCount = 1;
    ci.ppEnabledExtensionNames = &ext;
  }
  return vkCreateInstance(&ci, nullptr, out);
}

bool has_layer(const char* name) {
  uint32_t n = 0;
  if (vkEnumerateInstanceLayerProperties(&n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkLayerProperties> layers(n);
  if (vkEnumerateInstanceLayerProperties(&n, layers.data()) != VK_SUCCESS) return false;
  for (const auto& l : layers)
    if (std::strcmp(l.layerName, name) == 0) return true;
  return false;
}

// The devices with a compute queue (their queue family), in enumeration order.
std::vector<std::pair<VkPhysicalDevice, uint32_t>> compute_devices(VkInstance instance) {
  uint32_t n = 0;
  std::vector<std::pair<VkPhysicalDevice, uint32_t>> out;
  if (vkEnumeratePhysicalDevices(instance, &n, nullptr) != VK_SUCCESS || n == 0) return out;
  std::vector<VkPhysicalDevice> all(n);
  if (vkEnumeratePhysicalDevices(instance, &n, all.data()) != VK_SUCCESS) return out;
  for (VkPhysicalDevice d : all) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(d, &props);
    if (props.apiVersion < VK_API_VERSION_1_2) continue;
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(d, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> families(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(d, &nq, families.data());
    for (uint32_t f = 0; f < nq; ++f) {
      if (families[f].queueFlags & VK_QUEUE_COMPUTE_BIT) {
        out.emplace_back(d, f);
        break;
      }
    }
  }
  return out;
}

uint64_t local_heap_bytes(const VkPhysicalDeviceMemoryProperties& m) {
  uint64_t best = 0;
  for (uint32_t h = 0; h < m.memoryHeapCount; ++h)
    if ((m.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && m.memoryHeaps[h].size > best)
      best = m.memoryHeaps[h].size;
  return best;
}

std::string describe_device(VkPhysicalDevice d) {
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(d, &props);
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(d, &mem);
  const char* kind = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU              ? "cpu"
                     : props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU   ? "discrete"
                     : props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? "integrated"
                                                                                  : "other";
  return fmt::format("{} ({}, Vulkan {}.{}, {:.1f} GiB)", props.deviceName, kind, VK_API_VERSION_MAJOR(props.apiVersion),
                     VK_API_VERSION_MINOR(props.apiVersion), static_cast<double>(local_heap_bytes(mem)) / (1 << 30));
}

}  // namespace

const char* result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    default: return "VkResult";
  }
}

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) fail("vulkan: {}: {} ({})", what, result_name(r), static_cast<int>(r));
}

std::vector<std::string> device_names(std::string* why_not) {
  VkInstance instance = VK_NULL_HANDLE;
  const VkResult r = make_instance(false, &instance);
  if (r != VK_SUCCESS) {
    *why_not = fmt::format("no Vulkan driver ({})", result_name(r));
    return {};
  }
  std::vector<std::string> names;
  for (const auto& [d, family] : compute_devices(instance)) names.push_back(describe_device(d));
  vkDestroyInstance(instance, nullptr);
  if (names.empty()) *why_not = "no Vulkan 1.2 device with a compute queue";
  return names;
}

VKAPI_ATTR VkBool32 VKAPI_CALL Device::on_debug(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                VkDebugUtilsMessageTypeFlagsEXT, const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                void* user) {
  auto* self = static_cast<Device*>(user);
  const char* level = severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT     ? "error"
                      : severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT ? "warning"
                                                                                    : "info";
  if (self->on_message_) self->on_message_(fmt::format("{}: {}", level, data && data->pMessage ? data->pMessage : ""));
  return VK_FALSE;
}

std::unique_ptr<Device> Device::create(const OpenOptions& options, std::string* why_not) {
  if (options.validation && !has_layer(kValidationLayer)) {
    *why_not = "the Vulkan validation layer is not installed (Debian: vulkan-validationlayers)";
    return nullptr;
  }
  std::unique_ptr<Device> dev(new Device());
  dev->on_message_ = options.on_message;
  const VkResult r = make_instance(options.validation, &dev->instance_);
  if (r != VK_SUCCESS) {
    *why_not = fmt::format("no Vulkan driver ({})", result_name(r));
    return nullptr;
  }
  if (options.validation) {
    auto create_messenger = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(dev->instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (!create_messenger) {
      *why_not = "VK_EXT_debug_utils is not available";
      return nullptr;
    }
    auto mi = make_info<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
    // Warnings and errors (info and verbose are the loader's chatter, not findings).
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = &Device::on_debug;
    mi.pUserData = dev.get();
    check(create_messenger(dev->instance_, &mi, nullptr, &dev->messenger_), "vkCreateDebugUtilsMessengerEXT");
  }
  const auto devices = compute_devices(dev->instance_);
  if (devices.empty()) {
    *why_not = "no Vulkan 1.2 device with a compute queue";
    return nullptr;
  }
  const Selection& sel = options.selection;
  size_t pick = 0;
  if (sel.mode == Selection::Mode::kIndex) {
    if (sel.index < 0 || static_cast<size_t>(sel.index) >= devices.size()) {
      *why_not = fmt::format("--gpu {}: this machine has {} device(s), numbered from 0", sel.index, devices.size());
      return nullptr;
    }
    pick = static_cast<size_t>(sel.index);
  } else {
    // auto: the first discrete GPU, else the first integrated one, else the first device.
    int best = -1;
    for (size_t i = 0; i < devices.size(); ++i) {
      VkPhysicalDeviceProperties props;
      vkGetPhysicalDeviceProperties(devices[i].first, &props);
      const int rank = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU     ? 3
                       : props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? 2
                                                                                    : 1;
      if (rank > best) best = rank, pick = i;
    }
  }
  dev->physical_ = devices[pick].first;
  dev->queue_family_ = devices[pick].second;
  vkGetPhysicalDeviceProperties(dev->physical_, &dev->props_);
  vkGetPhysicalDeviceMemoryProperties(dev->physical_, &dev->memory_);

  // float64 arithmetic: the shaders' exact fma (common.glsl fma_exact).
  VkPhysicalDeviceFeatures supported;
  vkGetPhysicalDeviceFeatures(dev->physical_, &supported);
  if (!supported.shaderFloat64) {
    *why_not = fmt::format("{} has no shaderFloat64 (the kernels' exact fma needs it)", dev->props_.deviceName);
    return nullptr;
  }
  VkPhysicalDeviceFeatures features{};
  features.shaderFloat64 = VK_TRUE;
  const float priority = 1.0f;
  auto qi = make_info<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qi.queueFamilyIndex = dev->queue_family_;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;
  auto di = make_info<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  di.pEnabledFeatures = &features;
  check(vkCreateDevice(dev->physical_, &di, nullptr, &dev->device_), "vkCreateDevice");
  vkGetDeviceQueue(dev->device_, dev->queue_family_, 0, &dev->queue_);
  auto pi = make_info<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = dev->queue_family_;
  check(vkCreateCommandPool(dev->device_, &pi, nullptr, &dev->pool_), "vkCreateCommandPool");
  auto fi = make_info<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  check(vkCreateFence(dev->device_, &fi, nullptr, &dev->fence_), "vkCreateFence");
  return dev;
}

Device::~Device() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    if (fence_) vkDestroyFence(device_, fence_, nullptr);
    if (pool_) vkDestroyCommandPool(device_, pool_, nullptr);
    vkDestroyDevice(device_, nullptr);
  }
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

uint64_t Device::device_local_bytes() const { return local_heap_bytes(memory_); }

int Device::memory_type(uint32_t type_bits, VkMemoryPropertyFlags flags) const {
  for (uint32_t t = 0; t < memory_.memoryTypeCount; ++t)
    if ((type_bits & (1u << t)) && (memory_.memoryTypes[t].propertyFlags & flags) == flags) return static_cast<int>(t);
  return -1;
}

void Device::run(const std::function<void(VkCommandBuffer)>& record) {
  auto ai = make_info<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  ai.commandPool = pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cb;
  check(vkAllocateCommandBuffers(device_, &ai, &cb), "vkAllocateCommandBuffers");
  struct Free {
    VkDevice d;
    VkCommandPool p;
    VkCommandBuffer c;
    ~Free() { vkFreeCommandBuffers(d, p, 1, &c); }
  } free_cb{device_, pool_, cb};
  auto bi = make_info<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer");
  record(cb);
  check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
  auto si = make_info<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  check(vkResetFences(device_, 1, &fence_), "vkResetFences");
  check(vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit");
  check(vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
}

}  // namespace dsv4::gpu::vulkan
