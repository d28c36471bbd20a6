#include "dsv4/gpu/vulkan/pipelines.h"

#include <vector>

#include "dsv4/util/error.h"

namespace dsv4::gpu::vulkan {

Pipeline::Pipeline(Device& device, Shader shader, uint32_t buffers, uint32_t push_bytes)
    : device_(device), buffers_(buffers), push_bytes_(push_bytes) {
  const VkDevice d = device.handle();
  const Spirv code = shader_code(shader);
  auto mi = make_info<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  mi.codeSize = code.count * sizeof(uint32_t);
  mi.pCode = code.words;
  check(vkCreateShaderModule(d, &mi, nullptr, &module_), "vkCreateShaderModule");

  std::vector<VkDescriptorSetLayoutBinding> bindings(buffers);
  for (uint32_t b = 0; b < buffers; ++b) {
    bindings[b] = {};
    bindings[b].binding = b;
    bindings[b].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    bindings[b].descriptorCount = 1;
    bindings[b].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  auto li = make_info<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  li.bindingCount = buffers;
  li.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(d, &li, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  auto pli = make_info<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &set_layout_;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &range;
  check(vkCreatePipelineLayout(d, &pli, nullptr, &layout_), "vkCreatePipelineLayout");

  auto ci = make_info<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module_;
  ci.stage.pName = "main";
  ci.layout = layout_;
  check(vkCreateComputePipelines(d, VK_NULL_HANDLE, 1, &ci, nullptr, &pipeline_), "vkCreateComputePipelines");

  // One set per dispatch; dispatches are synchronous, so the pool is reset before each.
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, buffers};
  auto pi = make_info<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
  pi.maxSets = 1;
  pi.poolSizeCount = 1;
  pi.pPoolSizes = &size;
  check(vkCreateDescriptorPool(d, &pi, nullptr, &pool_), "vkCreateDescriptorPool");
}

Pipeline::~Pipeline() {
  const VkDevice d = device_.handle();
  vkDestroyDescriptorPool(d, pool_, nullptr);
  vkDestroyPipeline(d, pipeline_, nullptr);
  vkDestroyPipelineLayout(d, layout_, nullptr);
  vkDestroyDescriptorSetLayout(d, set_layout_, nullptr);
  vkDestroyShaderModule(d, module_, nullptr);
}

void Pipeline::dispatch(std::initializer_list<const Buffer*> buffers, const void* push, uint32_t groups_x,
                        uint32_t groups_y) {
  if (buffers.size() != buffers_) fail("vulkan: dispatch with {} buffers, the pipeline has {}", buffers.size(), buffers_);
  if (groups_x == 0 || groups_y == 0) return;
  const VkDevice d = device_.handle();
  check(vkResetDescriptorPool(d, pool_, 0), "vkResetDescriptorPool");
  auto ai = make_info<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
  ai.descriptorPool = pool_;
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &set_layout_;
  VkDescriptorSet set;
  check(vkAllocateDescriptorSets(d, &ai, &set), "vkAllocateDescriptorSets");
  std::vector<VkDescriptorBufferInfo> infos;
  std::vector<VkWriteDescriptorSet> writes;
  infos.reserve(buffers_);
  for (const Buffer* b : buffers) infos.push_back({b->handle(), 0, VK_WHOLE_SIZE});
  for (uint32_t b = 0; b < buffers_; ++b) {
    auto w = make_info<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    w.dstSet = set;
    w.dstBinding = b;
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &infos[b];
    writes.push_back(w);
  }
  vkUpdateDescriptorSets(d, buffers_, writes.data(), 0, nullptr);
  device_.run([&](VkCommandBuffer cb) {
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &set, 0, nullptr);
    vkCmdPushConstants(cb, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes_, push);
    vkCmdDispatch(cb, groups_x, groups_y, 1);
    // The results are read by the host after the fence.
    auto mb = make_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0,
                         nullptr);
  });
}

}  // namespace dsv4::gpu::vulkan
