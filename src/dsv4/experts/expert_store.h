// The SSD-streaming expert cache. A fixed number of equal slots (4 KiB aligned, one
// anonymous mapping) hold routed experts read on demand with O_DIRECT; a background read
// queue (io_uring, or pread threads) keeps several reads in flight.
//
// Requests come from the engine's compute thread in three strengths:
//   predict(l, E)   experts layer l will probably need (next-layer router lookahead):
//                   read only into slots nobody else needs, after every needed read;
//   prefetch(l, E)  experts layer l needs now, in the order it will acquire them; they are
//                   reserved until acquired (or until the next prefetch call), and read in
//                   order as slots become available;
//   ready(l, e)     whether acquire(l, e) would return at once (read done, or failed);
//   acquire(l, e)   blocks until the expert is in memory and pins it until release().
// Eviction is least-recently-used among slots that are neither pinned, reserved, nor
// being read. Pinned experts are never evicted.
//
// Results never depend on the cache: an expert's bytes are the checkpoint's bytes whether
// they were cached, prefetched or read on demand.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsv4/experts/expert_layout.h"
#include "dsv4/experts/expert_provider.h"
#include "dsv4/experts/read_queue.h"
#include "dsv4/io/config.h"
#include "dsv4/util/file.h"

namespace dsv4 {

enum class IoBackend : uint8_t { kAuto, kUring, kThreads };
// "auto", "uring", "threads"; throws Error naming --io otherwise.
IoBackend parse_io_backend(const std::string& text);

struct ExpertStoreOptions {
  int64_t slots = 0;             // cache slots (>= 1)
  IoBackend backend = IoBackend::kAuto;  // auto: io_uring, else pread threads
  int queue_depth = 4;           // experts read concurrently
  bool direct_io = true;         // false: buffered reads (testing / filesystems without O_DIRECT)
  bool predict = true;           // accept predict() hints (the engine's next-layer lookahead)
  int max_predicted_slots = -1;  // cap on slots holding unused predictions (-1: half the slots)
  // Guesses only use read slots the needed experts leave idle: none is started while a
  // needed read is queued or in flight, and at most this many guesses are in flight.
  // (-1: guesses may fill the whole queue whenever nothing needed is waiting.)
  int max_predicted_in_flight = 1;
  bool quiet = false;            // no notes on stderr
};

class ExpertStore final : public ExpertProvider {
 public:
  ExpertStore(const Checkpoint& ck, const ExpertStoreOptions& options);
  ~ExpertStore() override;

  void prefetch(int layer, std::span<const int> experts) override;
  void predict(int layer, std::span<const int> experts) override;
  bool wants_predictions() const override { return options_.predict; }
  bool ready(int layer, int expert) const override;
  const ExpertWeights& acquire(int layer, int expert) override;
  void release(int layer, int expert) override;
  ExpertStats stats() const override;
  uint64_t resident_bytes() const override;

  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  const char* backend_name() const { return queue_->name(); }
  bool direct_io() const;  // true if every shard is read with O_DIRECT

 private:
  enum class State : uint8_t { kFree, kLoading, kReady, kFailed };
  enum class Origin : uint8_t { kDemand, kPrefetch, kPredict };
  struct Slot {
    int32_t key = -1;  // layer * n_experts + expert
    State state = State::kFree;
    Origin origin = Origin::kDemand;
    int pins = 0;
    uint64_t reserved_epoch = 0;  // == epoch_: needed by the current prefetch, not yet acquired
    uint64_t last_use = 0;        // LRU clock
    bool fresh = false;           // read from the SSD and not yet acquired
    bool unused_prediction = false;  // read by predict() and not yet acquired
    std::string error;
    ExpertWeights weights;
  };
  struct Shard {
    std::string path;
    File buffered;
    File direct;  // invalid if the filesystem refuses O_DIRECT
    bool use_direct = false;
  };

  int32_t key(int layer, int expert) const { return layer * n_experts_ + expert; }
  bool reserved(const Slot& s) const { return s.reserved_epoch == epoch_; }
  bool evictable(const Slot& s, bool allow_reserved) const;
  int find_victim(bool allow_reserved) const;
  // Reads are prepared under the mutex and handed to the queue after it is released, so
  // the I/O thread never holds the cache lock across a syscall.
  struct Submission {
    uint64_t slot;
    std::vector<ReadOp> ops;
  };
  using Submissions = std::vector<Submission>;
  void start_read(int slot, int32_t key, Origin origin, Submissions& out);
  void pump(Submissions& out);  // prepares queued reads while slots are available
  void submit(Submissions& out);
  void on_read_done(uint64_t slot, const ReadOutcome& outcome);
  void check_key(int layer, int expert) const;
  void note_buffered(const std::string& path);

  ExpertStoreOptions options_;
  ExpertLayout layout_;
  const int n_experts_;
  const ModelConfig config_;
  uint64_t slot_bytes_ = 0;
  std::vector<Shard> shards_;
  AlignedBuffer slot_memory_;  // all slots; untouched (not resident) until a read fills a slot

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // key -> slot, -1 if absent
  std::deque<int32_t> want_needed_, want_predicted_;
  uint64_t epoch_ = 1, clock_ = 0;
  int loading_ = 0;            // reads in flight
  int loading_predicted_ = 0;  // of which started by predict()
  int predicted_unused_slots_ = 0;
  double busy_since_ = 0;
  bool warned_buffered_ = false;
  ExpertStats stats_;

  std::unique_ptr<ReadQueue> queue_;  // last member: destroyed first, joins its thread
};

}  // namespace dsv4
