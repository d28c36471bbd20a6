// Where the forward pass gets routed experts from. The model asks for one expert at a
// time (acquire/release) and hints what it will need next (prefetch); implementations
// range from "everything resident" to the SSD-streaming cache. An expert that cannot be
// had (a failed read, bytes that fail validation) makes acquire() throw Error naming the
// expert, its layer and the file: the forward pass and the request fail, nothing else.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/kernels/kernels.h"

namespace dsv4 {

class Checkpoint;
class IoFaults;
struct ModelConfig;

struct ExpertWeights {
  kernels::Matrix w1;  // gate projection [I, D]
  kernels::Matrix w3;  // up projection   [I, D]
  kernels::Matrix w2;  // down projection [D, I]
};

// Counters every provider keeps; all fields are totals since construction. Subtract two
// snapshots for the counts of one request.
struct ExpertStats {
  uint64_t requests = 0;          // acquire() calls
  uint64_t hits = 0;              // served from cache content an earlier request already used
  uint64_t misses = 0;            // served by a read made for it (prefetch, prediction or on demand)
  uint64_t reads = 0;             // expert reads completed
  uint64_t bytes_read = 0;        // bytes those reads moved (aligned windows included)
  uint64_t demand_reads = 0;      // reads that acquire() had to start itself (nothing asked earlier)
  uint64_t predicted_reads = 0;   // reads started by predict()
  uint64_t predicted_unused = 0;  // predicted reads evicted before anything acquired them
  uint64_t expected_reads = 0;    // reads started by expect() (certain: hash-routed layers)
  uint64_t read_requests = 0;     // read syscalls / io_uring reads behind those reads (retries included)
  uint64_t read_windows = 0;      // the fewest requests the shard layout allows for them
  uint64_t read_pieces = 0;       // requests the store asked for them (windows split over folders)
  uint64_t merged_windows = 0;    // of those, windows read within a neighbour's request (adjacent scales)
  uint64_t read_retries = 0;      // expert reads repeated on another copy or a reopened shard
  uint64_t read_failures = 0;     // expert reads that failed on every copy
  uint64_t stalls = 0;            // acquire() calls that had to wait for a read
  double read_seconds = 0;        // wall time with at least one read in flight
  double blocked_seconds = 0;     // time the compute thread waited in acquire()
  // Per folder (the checkpoint's first, then each mirror; empty for one folder's resident
  // experts): bytes of completed reads served from it, and wall time it had a read in flight.
  std::vector<uint64_t> folder_bytes;
  std::vector<double> folder_busy_seconds;

  double hit_rate() const { return requests ? double(hits) / double(requests) : 0.0; }
  double requests_per_read() const { return reads ? double(read_requests) / double(reads) : 0.0; }
  double ranges_per_read() const { return reads ? double(read_windows) / double(reads) : 0.0; }
  double read_gbps() const { return read_seconds > 0 ? double(bytes_read) / read_seconds / 1e9 : 0.0; }
  ExpertStats operator-(const ExpertStats& earlier) const;
};

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // Non-blocking: these experts of `layer` will be acquired next, in this order.
  virtual void prefetch(int layer, std::span<const int> experts) = 0;
  // Non-blocking, weaker: these experts of `layer` will probably be needed (a guess, e.g.
  // the next layer's router applied to the current hidden state). Replaces the previous guess.
  virtual void predict(int, std::span<const int>) {}
  // Non-blocking, certain: these experts of `layer` will be acquired in the coming forward
  // pass (hash-routed layers: they follow from the token ids). Replaces the layer's
  // previous list; lists of several layers may be pending at once.
  virtual void expect(int layer, std::span<const int> experts) { predict(layer, experts); }
  // Whether predict() / expect() do anything (the engine skips computing guesses otherwise).
  virtual bool wants_predictions() const { return false; }
  // The most experts held at once (-1: no limit). A guess only pays while what it reads can
  // stay until used: the engine sizes its guesses by this.
  virtual int64_t capacity() const { return -1; }
  // Non-blocking: whether acquire() would return without waiting for a read (the MoE
  // computes experts that are already here while the others are still being read).
  virtual bool ready(int, int) const { return true; }
  // Blocks until the expert is in memory; it stays valid until the matching release().
  virtual const ExpertWeights& acquire(int layer, int expert) = 0;
  virtual void release(int layer, int expert) = 0;
  virtual ExpertStats stats() const = 0;
  // Bytes of RAM this provider holds for experts.
  virtual uint64_t resident_bytes() const = 0;
  // Empty while storage is healthy; else one line saying what is wrong (a shard refused,
  // replaced by a file that does not match, or deleted; experts whose last read failed).
  // May stat the checkpoint's files.
  virtual std::string storage_problem() { return ""; }
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
ExpertWeights expert_views(const ModelConfig& c, const uint8_t* base, const uint64_t offsets[6]);

// Empty, or which of the expert's E8M0 scales is out of range (value_check.h: NaN or above
// 2^32), naming the tensor; `part` (optional) is set to the bad part in ExpertLocation order
// and `index` (optional) to the bad scale's byte within it.
std::string expert_scale_problem(const ModelConfig& c, int layer, int expert, const ExpertWeights& w,
                                 int* part = nullptr, int64_t* index = nullptr);

// Reads every routed expert into RAM at start-up (validating their scales). Simple and fast
// when the model fits. The main layers' experts; the MTP layer's are only read when something
// runs it. `faults`: the test fault layer for those reads (null: none).
std::unique_ptr<ExpertProvider> make_resident_experts(const Checkpoint& ck, IoFaults* faults = nullptr);
// The experts of layers [first_layer, first_layer + n_layers) (the MTP drafter's).
std::unique_ptr<ExpertProvider> make_resident_experts(const Checkpoint& ck, int first_layer, int n_layers,
                                                      IoFaults* faults = nullptr);

}  // namespace dsv4
