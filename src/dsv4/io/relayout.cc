#include "dsv4/io/relayout.h"

#include <filesystem>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsv4/io/config.h"
#include "dsv4/io/safetensors.h"
#include "dsv4/io/safetensors_writer.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

// The shard file names the index lists (or the one model.safetensors), in name order.
std::vector<std::string> shard_names(const std::string& src) {
  const std::string index = src + "/model.safetensors.index.json";
  if (!path_exists(index)) {
    if (!path_exists(src + "/model.safetensors")) fail("{}: neither model.safetensors.index.json nor model.safetensors", src);
    return {"model.safetensors"};
  }
  const nlohmann::json j = nlohmann::json::parse(read_small_file(index, 256 << 20), nullptr, false);
  if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: not JSON with a weight_map object", index);
  std::set<std::string> names;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) fail("{}: weight_map.{} is not a string", index, tensor);
    const std::string name = shard.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos) fail("{}: weight_map.{} names \"{}\", not a file name", index, tensor, name);
    names.insert(name);
  }
  return {names.begin(), names.end()};
}

// The header's __metadata__ (string values, as the format allows), so the copy keeps it.
std::map<std::string, std::string> header_metadata(const SafetensorsFile& f) {
  const std::string raw = read_raw_header(f.file());
  const nlohmann::json j = nlohmann::json::parse(raw.substr(8), nullptr, false);
  std::map<std::string, std::string> out;
  if (j.is_discarded() || !j.contains("__metadata__")) return out;
  for (const auto& [k, v] : j["__metadata__"].items()) {
    if (!v.is_string()) fail("{}: __metadata__.{} is not a string", f.path(), k);
    out[k] = v.get<std::string>();
  }
  return out;
}

}  // namespace

RelayoutResult relayout_checkpoint(const std::string& src, const std::string& dst, TensorLayout layout,
                                   const RelayoutProgress& progress) {
  if (!is_directory(src)) fail("{}: not a directory", src);
  std::error_code ec;
  fs::create_directories(dst, ec);
  if (!is_directory(dst)) fail("{}: cannot create directory: {}", dst, ec.message());
  if (fs::equivalent(src, dst, ec)) fail("{}: is the source folder; relayout writes a copy elsewhere", dst);
  const std::string config_path = src + "/config.json";
  const ModelConfig config = ModelConfig::from_json(read_small_file(config_path, 16 << 20), config_path);

  const std::vector<std::string> names = shard_names(src);
  std::vector<SafetensorsFile> shards;
  uint64_t total = 0;
  for (const std::string& name : names) {
    shards.push_back(SafetensorsFile::open(src + "/" + name));
    for (const TensorInfo& t : shards.back().tensors()) total += t.bytes;
  }
  RelayoutResult result;
  constexpr uint64_t kChunk = 16ull << 20;
  std::vector<uint8_t> buffer(kChunk);
  for (size_t s = 0; s < shards.size(); ++s) {
    const SafetensorsFile& in = shards[s];
    std::vector<TensorDecl> decls;
    for (const TensorInfo& t : in.tensors()) decls.push_back({t.name, t.dtype, t.shape});
    if (layout == TensorLayout::kOfficial) {
      sort_safetensors_order(decls);
    } else {
      sort_module_order(decls, config);
    }
    SafetensorsWriter out(dst + "/" + names[s], decls, header_metadata(in));
    for (const TensorDecl& d : decls) {
      const TensorInfo& t = *in.find(d.name);
      for (uint64_t at = 0; at < t.bytes; at += kChunk) {
        const uint64_t n = std::min(kChunk, t.bytes - at);
        in.file().read_exact(buffer.data(), n, t.offset + at);
        out.write(buffer.data(), n);
      }
    }
    out.finish();
    result.tensor_bytes += out.data_bytes();
    ++result.shards;
    if (progress) progress(result.tensor_bytes, total);
  }
  const std::set<std::string> shard_set(names.begin(), names.end());
  for (const auto& entry : fs::directory_iterator(src)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || shard_set.count(name)) continue;
    fs::copy_file(entry.path(), fs::path(dst) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) fail("{}: cannot copy to {}: {}", entry.path().string(), dst, ec.message());
  }
  return result;
}

}  // namespace dsv4
