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
// Eviction follows the cache policy (--cache-policy, cache_policy.h: the same decisions the
// trace replay makes) among slots that are neither pinned, reserved, nor being read. Pinned
// experts are never evicted.
//
// Several folders (the checkpoint's and its mirrors): a large window of an expert is read in
// pieces, one per folder in proportion to the folders' read shares, so every drive works on
// every expert and the reads of one pass end together (whole experts per folder leave one
// drive idle while the other finishes the pass's odd expert: 1.5x of one drive measured, not
// 2x); a small window is read whole from the folder with the least queued bytes.
// Neighbours: in the official layout a layer's scales are one run in the file (sorted by
// name), so when the reads of experts whose scales sit end to end start together (a needed or
// expected expert pulls its waiting neighbours forward), their scale windows are one vectored
// request landing in each slot; the 4 KiB page two windows share is copied into the second.
// Faults: a piece that fails, comes back short, or lands in a shard that changed under the
// engine (shard_files.h) makes the whole read retry without that copy (on the others), and
// only when none is left does acquire() throw Error naming the expert,
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

#include "dsv4/experts/cache_policy.h"
#include "dsv4/experts/expert_layout.h"
#include "dsv4/experts/expert_provider.h"
#include "dsv4/platform/read_queue.h"
#include "dsv4/experts/shard_files.h"
#include "dsv4/io/config.h"
#include "dsv4/util/file.h"
#include "dsv4/util/io_faults.h"

namespace dsv4 {

enum class IoBackend : uint8_t { kAuto, kNative, kThreads };  // native: io_uring (Linux), IOCP (Windows)
// "auto", "threads", or the OS's own queue: "uring" (Linux), "iocp" (Windows); throws Error
// naming --io otherwise (also for another OS's queue).
IoBackend parse_io_backend(const std::string& text);
// "2,1" -> {2, 1} (--read-shares; "" -> {}: measured); throws Error naming --read-shares.
std::vector<double> parse_read_shares(const std::string& text);
// Checks the --mirror folders as an ExpertStore does at start (each a directory, not another
// of the folders, the checkpoint's config.json if it has one, at least one of the shards, each
// shard held the checkpoint's size and header); throws Error naming the folder or the file.
// For plans whose experts are all resident, which read no mirror but must not accept a bad one.
void check_mirrors(const Checkpoint& ck, const std::vector<std::string>& mirrors);

struct ExpertStoreOptions {
  int64_t slots = 0;             // cache slots (>= 1)
  IoBackend backend = IoBackend::kAuto;  // auto: the native queue, else pread threads
  CachePolicyKind cache_policy = default_cache_policy();  // which cached expert makes room
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
  // A window of at least twice this is read in pieces from several folders at once, in
  // proportion to their shares (every folder works on every expert, so a pass's reads end
  // together); smaller ones are read whole from the folder with the least queued work.
  uint64_t min_piece_bytes = 1 << 20;
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
  int64_t capacity() const override { return slots(); }
  bool ready(int layer, int expert) const override;
  const ExpertWeights& acquire(int layer, int expert) override;
  void release(int layer, int expert) override;
  ExpertStats stats() const override;
  uint64_t resident_bytes() const override;
  std::string storage_problem() override;

  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  CachePolicyKind cache_policy() const { return policy_.kind(); }
  const char* backend_name() const { return queue_->name(); }
  bool direct_io() const { return files_->all_direct(); }  // every copy is read with O_DIRECT
  // The share of expert reads each folder serves (checkpoint's first, then mirrors).
  const std::vector<double>& read_shares() const { return shares_; }
  // The folder a whole-window read of expert (layer, e) prefers when the folders are equally
  // loaded (a deterministic spread in proportion to the shares).
  int folder_of(int layer, int expert) const;

 private:
  enum class State : uint8_t { kFree, kLoading, kReady, kFailed };
  enum class Origin : uint8_t { kDemand, kPrefetch, kExpect, kPredict };
  // One request of an expert's read: which copy (and descriptor) serves which bytes of the slot.
  struct Piece {
    int copy = -1, fd = -1, folder = 0;
    uint64_t slot_offset = 0, length = 0;
    uint64_t file_offset = 0, needed = 0;
  };
  struct Slot {
    int32_t key = -1;  // layer * n_experts + expert
    State state = State::kFree;
    Origin origin = Origin::kDemand;
    int pins = 0;
    uint64_t reserved_epoch = 0;  // == epoch_: needed by the current prefetch, not yet acquired
    bool fresh = false;           // read from the SSD and not yet acquired
    bool unused_prediction = false;  // read by predict() or expect() and not yet acquired
    std::string error;
    ExpertWeights weights;
    // The read in flight: its pieces (one per request), the copies that failed it so far
    // (tried elsewhere next) and what went wrong with them.
    std::vector<Piece> pieces;
    uint64_t shared_bytes = 0;  // bytes of its small window the previous member of a merged read brought
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
  // Picks the copies for each window (avoiding the slot's bad copies), splitting it over
  // folders when it is large, and prepares the read; false when some window has no copy left.
  bool issue(int slot, Submissions& out);
  // The window's pieces: [slot offset, length, needed, copy] from `usable` (copies of its shard).
  void plan_pieces(int32_t key, const ReadWindow& w, const std::vector<int>& usable, std::vector<Piece>& out) const;
  void pump(Submissions& out);  // prepares queued reads while slots are available
  // After start_read(k) from `queue`: starts the reads of k's neighbours in the file that wait
  // in the same queue, and makes their small windows (the scales, which sit end to end in
  // the official layout) one request that lands in every member's slot.
  void start_neighbours(int32_t k, std::deque<int32_t>& queue, Origin origin, Submissions& out);
  void merge_reads(const std::vector<int32_t>& run, size_t first, Submissions& out);
  // A merged read's members, in file order: the slot, its expert, and the bytes at the start
  // of its small window (one page at most) that landed in the previous member's slot.
  struct GroupMember {
    int slot = -1;
    int32_t key = -1;
    uint8_t* shared_to = nullptr;
    const uint8_t* shared_from = nullptr;
    uint64_t shared = 0;
  };
  // One slot's read ended (`group_failed`: it was part of a merged read that failed somewhere;
  // then it is read again alone).
  void slot_read_done(int v, int32_t k, const ReadOutcome& outcome, bool group_failed);
  void submit(Submissions& out);
  void on_read_done(uint64_t tag, const ReadOutcome& outcome);
  void finish_read(Slot& s);  // bookkeeping when a slot's read ends, either way
  void pieces_done(const Slot& s, bool success);  // per-folder bookkeeping when a try of a read ends
  void check_key(int layer, int expert) const;
  void note_buffered(const std::string& path);
  std::string expert_name(int32_t key) const;
  std::vector<double> measure_shares();
  int pread_workers(int experts) const;  // the thread queue's workers for `experts` reads in flight

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
  CachePolicy policy_;            // eviction order of the slots
  std::deque<int32_t> want_needed_, want_expected_, want_predicted_;
  std::map<int32_t, std::string> failed_;  // experts whose last read failed a request
  std::map<uint32_t, std::vector<GroupMember>> groups_;  // merged reads in flight, by id
  uint32_t next_group_ = 0;
  uint64_t epoch_ = 1;
  int loading_ = 0;            // reads in flight
  int loading_predicted_ = 0;  // of which started by predict() (expect() reads count as needed)
  int predicted_unused_slots_ = 0;
  double busy_since_ = 0;
  std::vector<int> folder_in_flight_;      // requests in flight per folder
  std::vector<uint64_t> folder_queued_;    // bytes those requests read
  std::vector<double> folder_busy_since_;  // when each folder's requests in flight began
  bool warned_buffered_ = false;
  ExpertStats stats_;

  std::unique_ptr<ReadQueue> queue_;  // last member: destroyed first, joins its thread
};

}  // namespace dsv4
