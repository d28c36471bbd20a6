// The SSD-streaming expert cache. A fixed number of equal slots (4 KiB aligned, one
// anonymous mapping) hold routed experts read on demand with O_DIRECT; a background read
// queue (io_uring, or pread threads) keeps several reads in flight.
//
// Requests come from the engine's compute thread in four strengths:
//   predict(l, E)   experts layer l will probably need (next-layer router lookahead):
//                   read only into slots nobody else needs, after every needed read;
//   expect(l, E)    experts layer l will certainly need in this forward pass (hash-routed
//                   layers): read at full queue depth after the needed ones;
//   prefetch(l, E)  experts layer l needs now, in the order it will acquire them; they are
//                   reserved until acquired (or until the next prefetch call), and read in
//                   order as slots become available;
//   ready(l, e)     whether acquire(l, e) would return at once (read done, or failed);
//   acquire(l, e)   blocks until the expert is in memory and pins it until release().
// Eviction is least-recently-used among slots that are neither pinned, reserved, nor
// being read. Pinned experts are never evicted.
//
// Faults: each expert is read from one copy of its shard (the checkpoint's, or a mirror's,
// chosen per expert in proportion to the folders' read shares); a read that fails, comes
// back short, or lands in a shard that changed under the engine (shard_files.h) is retried
// on another copy, and only when none is left does acquire() throw Error naming the expert,
// its layer and the file. Values are checked when the bytes arrive: an E8M0 scale code
// above kMaxScaleCode (scales over 2^32, NaN included) fails the read the same way. Only the
// request that needed the expert fails; the next acquire() reads it again.
//
// Results never depend on the cache: an expert's bytes are the checkpoint's bytes whether
// they were cached, prefetched, read on demand or from a mirror.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsv4/experts/expert_layout.h"
#include "dsv4/experts/expert_provider.h"
#include "dsv4/experts/read_queue.h"
#include "dsv4/experts/shard_files.h"
#include "dsv4/io/config.h"
#include "dsv4/util/file.h"
#include "dsv4/util/io_faults.h"

namespace dsv4 {

enum class IoBackend : uint8_t { kAuto, kUring, kThreads };
// "auto", "uring", "threads"; throws Error naming --io otherwise.
IoBackend parse_io_backend(const std::string& text);
// "2,1" -> {2, 1} (--read-shares; "" -> {}: measured); throws Error naming --read-shares.
std::vector<double> parse_read_shares(const std::string& text);

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
  // Other folders with copies of the checkpoint's shards (same names), e.g. on other
  // drives. Each copy's size and header must equal the checkpoint's.
  std::vector<std::string> mirrors;
  // Share of the expert reads each folder serves (the checkpoint's folder first, then the
  // mirrors); empty: measured at start by reading a few experts from each folder.
  std::vector<double> read_shares;
  std::shared_ptr<IoFaults> faults;  // test fault layer for the expert reads (null: none)
};

class ExpertStore final : public ExpertProvider {
 public:
  ExpertStore(const Checkpoint& ck, const ExpertStoreOptions& options);
  ~ExpertStore() override;

  void prefetch(int layer, std::span<const int> experts) override;
  void predict(int layer, std::span<const int> experts) override;
  void expect(int layer, std::span<const int> experts) override;
  bool wants_predictions() const override { return options_.predict; }
  bool ready(int layer, int expert) const override;
  const ExpertWeights& acquire(int layer, int expert) override;
  void release(int layer, int expert) override;
  ExpertStats stats() const override;
  uint64_t resident_bytes() const override;
  std::string storage_problem() override;

  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  const char* backend_name() const { return queue_->name(); }
  bool direct_io() const { return files_->all_direct(); }  // every copy is read with O_DIRECT
  // The share of expert reads each folder serves (checkpoint's first, then mirrors).
  const std::vector<double>& read_shares() const { return shares_; }
  // The folder expert (layer, e) is read from when nothing fails.
  int folder_of(int layer, int expert) const;

 private:
  enum class State : uint8_t { kFree, kLoading, kReady, kFailed };
  enum class Origin : uint8_t { kDemand, kPrefetch, kExpect, kPredict };
  struct Slot {
    int32_t key = -1;  // layer * n_experts + expert
    State state = State::kFree;
    Origin origin = Origin::kDemand;
    int pins = 0;
    uint64_t reserved_epoch = 0;  // == epoch_: needed by the current prefetch, not yet acquired
    uint64_t last_use = 0;        // LRU clock
    bool fresh = false;           // read from the SSD and not yet acquired
    bool unused_prediction = false;  // read by predict() or expect() and not yet acquired
    std::string error;
    ExpertWeights weights;
    // The read in flight: the copy and descriptor of each window, the copies that failed
    // it so far (tried elsewhere next) and what went wrong with them.
    std::vector<int> copies, fds;
    std::vector<int> bad_copies;
    std::string failures;
    int retries = 0;
  };

  int32_t key(int layer, int expert) const { return layer * n_experts_ + expert; }
  bool reserved(const Slot& s) const { return s.reserved_epoch == epoch_; }
  bool evictable(const Slot& s, bool allow_reserved) const;
  int find_victim(bool allow_reserved) const;
  // Reads are prepared under the mutex and handed to the queue after it is released, so
  // the I/O thread never holds the cache lock across a syscall.
  struct Submission {
    uint64_t tag;  // slot and key
    std::vector<ReadOp> ops;
  };
  using Submissions = std::vector<Submission>;
  void start_read(int slot, int32_t key, Origin origin, Submissions& out);
  // Picks a copy for each window (avoiding the slot's bad copies) and prepares the read;
  // false when some window has no copy left to try.
  bool issue(int slot, Submissions& out);
  void pump(Submissions& out);  // prepares queued reads while slots are available
  void submit(Submissions& out);
  void on_read_done(uint64_t tag, const ReadOutcome& outcome);
  void finish_read(Slot& s);  // bookkeeping when a slot's read ends, either way
  void check_key(int layer, int expert) const;
  void note_buffered(const std::string& path);
  std::string expert_name(int32_t key) const;
  std::vector<double> measure_shares();

  ExpertStoreOptions options_;
  ExpertLayout layout_;
  const int n_experts_;
  const ModelConfig config_;
  uint64_t slot_bytes_ = 0;
  std::unique_ptr<ShardFiles> files_;
  std::vector<double> shares_;  // read share per folder
  AlignedBuffer slot_memory_;  // all slots; untouched (not resident) until a read fills a slot

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // key -> slot, -1 if absent
  std::deque<int32_t> want_needed_, want_expected_, want_predicted_;
  std::map<int32_t, std::string> failed_;  // experts whose last read failed a request
  uint64_t epoch_ = 1, clock_ = 0;
  int loading_ = 0;            // reads in flight
  int loading_predicted_ = 0;  // of which started by predict() (expect() reads count as needed)
  int predicted_unused_slots_ = 0;
  double busy_since_ = 0;
  bool warned_buffered_ = false;
  ExpertStats stats_;

  std::unique_ptr<ReadQueue> queue_;  // last member: destroyed first, joins its thread
};

}  // namespace dsv4
