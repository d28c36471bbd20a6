// Where the forward pass gets routed experts from. The model asks for one expert at a
// time (acquire/release) and hints what it will need next (prefetch); implementations
// range from "everything resident" to the SSD-streaming cache.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/kernels/kernels.h"

namespace dsv4 {

class Checkpoint;

struct ExpertWeights {
  kernels::Matrix w1;  // gate projection [I, D]
  kernels::Matrix w3;  // up projection   [I, D]
  kernels::Matrix w2;  // down projection [D, I]
};

// Counters every provider keeps; all fields are totals since construction.
struct ExpertStats {
  uint64_t requests = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_read = 0;
  double read_seconds = 0;     // wall time the loaders spent reading
  double blocked_seconds = 0;  // time the compute thread waited for an expert
};

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // Non-blocking hint: these experts of `layer` will be acquired soon.
  virtual void prefetch(int layer, std::span<const int> experts) = 0;
  // Blocks until the expert is in memory; it stays valid until the matching release().
  virtual const ExpertWeights& acquire(int layer, int expert) = 0;
  virtual void release(int layer, int expert) = 0;
  virtual ExpertStats stats() const = 0;
  // Bytes of RAM this provider holds for experts.
  virtual uint64_t resident_bytes() const = 0;
};

// Location of one expert's six tensors in the checkpoint (weight + scale for w1, w3, w2).
struct ExpertLocation {
  struct Part {
    const class SafetensorsFile* shard = nullptr;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  Part parts[6];  // w1.weight, w1.scale, w3.weight, w3.scale, w2.weight, w2.scale
  uint64_t total_bytes() const;
};
ExpertLocation locate_expert(const Checkpoint& ck, int layer, int expert);

// Shapes of an expert's matrices with their data/scale pointers into `base`, where the six
// parts are laid out back to back in the order of ExpertLocation::parts (each part aligned
// to `align` bytes).
ExpertWeights expert_views(const Checkpoint& ck, const uint8_t* base, const uint64_t offsets[6]);

// Reads every routed expert into RAM at start-up. Simple and fast when the model fits.
std::unique_ptr<ExpertProvider> make_resident_experts(const Checkpoint& ck);

}  // namespace dsv4
