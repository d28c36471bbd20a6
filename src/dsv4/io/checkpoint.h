// A checkpoint directory exactly as the hub ships it: config.json plus either one
// model.safetensors or model.safetensors.index.json and its shards. Opening validates the
// index against the shards and the tensor set against the schema the config implies, and
// reports every problem at once.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/io/config.h"
#include "dsv4/io/safetensors.h"

namespace dsv4 {

struct TensorRef {
  const SafetensorsFile* shard = nullptr;
  const TensorInfo* info = nullptr;
};

// Parses model.safetensors.index.json: tensor name -> shard file name (validated to be a
// plain file name inside the directory, each tensor listed once).
std::map<std::string, std::string> parse_weight_map(const std::string& text, const std::string& path);

class Checkpoint {
 public:
  // Throws Error listing every problem found (one line each, naming file and tensor/field).
  // `shard_dirs`: other folders where shards missing from `dir` may be (a checkpoint spread
  // over several drives); the first folder that holds a shard provides it.
  static Checkpoint open(const std::string& dir, const std::vector<std::string>& shard_dirs = {});

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }

  // Null if absent.
  const TensorRef* find(const std::string& name) const;
  // Throws Error naming the tensor if absent.
  const TensorRef& get(const std::string& name) const;

  // Whether the first MTP layer (mtp.0) is there and well-formed, so it can draft.
  bool has_mtp() const;
  // Why mtp.0 cannot draft (the target model loads regardless); empty when it can.
  const std::vector<std::string>& mtp_problems() const { return mtp_problems_; }
  // Drafter tensors nothing loads: later MTP layers, other "mtp." tensors (DSpark heads).
  const std::vector<std::string>& unused_tensors() const { return unused_tensors_; }

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, TensorRef> tensors_;
  std::vector<std::string> mtp_problems_;
  std::vector<std::string> unused_tensors_;
};

}  // namespace dsv4
