#include "dsv4/io/checkpoint.h"

#include <set>

#include <simdjson.h>

#include "dsv4/io/schema.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"

namespace dsv4 {
namespace {

// Shard names come from a file the user downloaded: keep them inside the directory.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.size() < 256 && name.find('/') == std::string::npos && name != "." &&
         name != ".." && name.find('\0') == std::string::npos;
}

[[noreturn]] void fail_all(const std::vector<std::string>& problems) {
  std::string message;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (i) message += '\n';
    message += problems[i];
  }
  if (problems.size() > 1) message += fmt::format("\n({} problems)", problems.size());
  throw Error(message);
}

}  // namespace

std::map<std::string, std::string> parse_weight_map(const std::string& text, const std::string& path) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root)) fail("{}: not valid JSON: {}", path, simdjson::error_message(err));
  simdjson::dom::object wm;
  if (root["weight_map"].get_object().get(wm)) fail("{}: field weight_map is missing or not an object", path);
  std::map<std::string, std::string> weight_map;
  for (auto field : wm) {
    std::string name(field.key);
    std::string_view shard;
    if (field.value.get_string().get(shard)) fail("{}: weight_map.{} is not a string", path, name);
    std::string shard_name(shard);
    if (!is_plain_file_name(shard_name))
      fail("{}: weight_map.{} names \"{}\", which is not a file name inside the checkpoint directory", path, name,
           shard_name);
    if (!weight_map.emplace(name, shard_name).second) fail("{}: tensor {} is listed twice in weight_map", path, name);
  }
  if (weight_map.empty()) fail("{}: weight_map is empty", path);
  return weight_map;
}

const TensorRef* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorRef& Checkpoint::get(const std::string& name) const {
  const TensorRef* ref = find(name);
  if (!ref) fail("{}: tensor {} is missing", dir_, name);
  return *ref;
}

bool Checkpoint::has_mtp() const { return config_.num_mtp_layers > 0 && mtp_problems_.empty(); }

Checkpoint Checkpoint::open(const std::string& dir_in, const std::vector<std::string>& shard_dirs) {
  Checkpoint ck;
  ck.dir_ = dir_in;
  while (ck.dir_.size() > 1 && ck.dir_.back() == '/') ck.dir_.pop_back();
  const std::string& dir = ck.dir_;
  if (!is_directory(dir)) fail("{}: not a directory", dir);
  if (!path_exists(dir + "/config.json")) fail("{}/config.json: missing (not a hub checkpoint directory?)", dir);
  ck.config_ = ModelConfig::load(dir + "/config.json");

  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> problems;
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_names;
  if (path_exists(index_path)) {
    weight_map = parse_weight_map(read_small_file(index_path, 256ull << 20), index_path);
    std::set<std::string> shard_set;
    for (const auto& [name, shard_name] : weight_map)
      if (shard_set.insert(shard_name).second) shard_names.push_back(shard_name);
  } else if (path_exists(dir + "/model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    fail("{}: neither model.safetensors.index.json nor model.safetensors is present", dir);
  }

  std::map<std::string, const SafetensorsFile*> shard_by_name;
  for (const std::string& name : shard_names) {
    std::string path = dir + "/" + name;
    for (size_t i = 0; i < shard_dirs.size() && !path_exists(path); ++i) path = shard_dirs[i] + "/" + name;
    if (!path_exists(path)) {
      problems.push_back(fmt::format("{}: shard {} named in the index does not exist{}", index_path, name,
                                     shard_dirs.empty() ? "" : " (nor in any --mirror folder)"));
      continue;
    }
    ck.shards_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
    shard_by_name[name] = ck.shards_.back().get();
  }
  if (!problems.empty()) fail_all(problems);

  for (const auto& shard : ck.shards_) {
    for (const TensorInfo& info : shard->tensors()) {
      auto [it, inserted] = ck.tensors_.emplace(info.name, TensorRef{shard.get(), &info});
      if (!inserted) {
        problems.push_back(fmt::format("{}: tensor {} is duplicated (also in {})", shard->path(), info.name,
                                       it->second.shard->path()));
      }
    }
  }
  if (!weight_map.empty()) {
    for (const auto& [name, shard_name] : weight_map) {
      const SafetensorsFile* shard = shard_by_name[shard_name];
      if (!shard->find(name))
        problems.push_back(fmt::format("{}: tensor {} is listed in the index but missing from this shard",
                                       shard->path(), name));
    }
    for (const auto& [name, ref] : ck.tensors_) {
      auto it = weight_map.find(name);
      if (it == weight_map.end()) {
        problems.push_back(fmt::format("{}: tensor {} is not listed in {}", ref.shard->path(), name, index_path));
      } else if (shard_by_name[it->second] != ref.shard) {
        problems.push_back(fmt::format("{}: tensor {} is in this shard but the index says {}", ref.shard->path(),
                                       name, it->second));
      }
    }
  }
  if (!problems.empty()) fail_all(problems);

  SchemaReport schema = check_schema(ck.config_, ck.tensors_, dir);
  if (!schema.problems.empty()) fail_all(schema.problems);
  ck.mtp_problems_ = std::move(schema.mtp_problems);
  ck.unused_tensors_ = std::move(schema.unused);
  return ck;
}

}  // namespace dsv4
