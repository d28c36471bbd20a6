// Storage that survives: the fault layer on both read queues, read faults failing only the
// request that needed the expert (at load, prefill and decode; in the engine, the CLI and the
// server), mirrors (retry on another copy, bit-identical output, read shares), shards
// truncated, replaced by `mv` or deleted while the engine runs, expert scales validated when
// the bytes arrive (resident and streamed), non-finite activations named, inspect --deep.
#include <gtest/gtest.h>
#include <httplib.h>

#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dsv4/experts/expert_store.h"
#include "dsv4/experts/read_queue.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/model/engine.h"
#include "dsv4/runtime/model_loader.h"
#include "dsv4/runtime/generator.h"
#include "dsv4/server/http_server.h"
#include "dsv4/text/chat_format.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/util/error.h"
#include "dsv4/util/io_faults.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using test::fixture;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// A writable copy of a fixture (its files can be truncated, replaced or corrupted).
struct Copy {
  explicit Copy(const std::string& name, const std::string& sub = "ck") : dir(tmp / sub) {
    test::copy_dir(fixture(name), dir);
  }
  test::TempDir tmp;
  std::string dir;
};

void poke(const std::string& path, uint64_t offset, uint8_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(value));
  ASSERT_TRUE(f.good()) << path;
}

std::vector<uint8_t> file_bytes(const SafetensorsFile& shard, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> out(n);
  shard.file().read_exact(out.data(), n, offset);
  return out;
}

// Every part of an acquired expert equals the checkpoint's bytes.
void expect_checkpoint_bytes(const Checkpoint& ck, const ExpertWeights& w, int layer, int expert) {
  const ExpertLocation loc = locate_expert(ck, layer, expert);
  const kernels::Matrix* m[3] = {&w.w1, &w.w3, &w.w2};
  for (int part = 0; part < 6; ++part) {
    const std::vector<uint8_t> want = file_bytes(*loc.parts[part].shard, loc.parts[part].offset, loc.parts[part].bytes);
    const uint8_t* got = part % 2 ? m[part / 2]->scales : static_cast<const uint8_t*>(m[part / 2]->data);
    ASSERT_EQ(std::memcmp(got, want.data(), want.size()), 0) << "layer " << layer << " expert " << expert;
  }
}

// A fault rule on the read of one expert (a byte in the middle of its w1 weight).
std::string fault_on_expert(const Checkpoint& ck, const std::string& kind, int layer, int expert,
                            const std::string& extra = "") {
  const ExpertLocation loc = locate_expert(ck, layer, expert);
  return fmt::format("{}:path={}:offset={}{}", kind, loc.parts[0].shard->path(),
                     loc.parts[0].offset + loc.parts[0].bytes / 2, extra);
}

// Resident experts that record which (layer, expert) pairs were acquired.
class RecordingExperts final : public ExpertProvider {
 public:
  explicit RecordingExperts(const Checkpoint& ck) : inner_(make_resident_experts(ck)) {}
  void prefetch(int layer, std::span<const int> experts) override { inner_->prefetch(layer, experts); }
  const ExpertWeights& acquire(int layer, int expert) override {
    acquired.push_back({layer, expert});
    return inner_->acquire(layer, expert);
  }
  void release(int layer, int expert) override { inner_->release(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  std::vector<std::pair<int, int>> acquired;

 private:
  std::unique_ptr<ExpertProvider> inner_;
};

ExpertStoreOptions store_options(IoBackend backend, int slots = 4) {
  ExpertStoreOptions o;
  o.slots = slots;
  o.backend = backend;
  o.quiet = true;
  return o;
}

LoadOptions streamed(IoBackend backend, std::shared_ptr<IoFaults> faults = nullptr) {
  LoadOptions o;
  o.engine.numerics = kernels::Numerics::kReference;
  o.engine.threads = 1;
  o.ram = "min";
  o.print_plan = false;
  o.store.backend = backend;
  o.store.quiet = true;
  o.store.faults = std::move(faults);
  return o;
}

const IoBackend kBackends[] = {IoBackend::kUring, IoBackend::kThreads};
const char* name(IoBackend b) { return b == IoBackend::kThreads ? "threads" : "io_uring"; }

// ---- the fault layer ------------------------------------------------------------------------

TEST(IoFaults, ParsesRulesAndNamesTheSourceOnErrors) {
  auto f = IoFaults::parse("eio:path=abc:offset=100:after=2:count=3;short;rate:mbps=50", "DSV4_TEST_IO_FAULTS");
  ASSERT_NE(f, nullptr);
  // after=2: the first two matching reads pass; then three fail; then reads pass again.
  int failed = 0;
  for (int i = 0; i < 8; ++i) failed += f->before_read("xabcx", 0, 4096).error == EIO;
  EXPECT_EQ(failed, 3);
  EXPECT_EQ(f->before_read("other", 0, 4096).error, 0);    // path does not match
  EXPECT_EQ(f->before_read("abc", 200, 4096).error, 0);    // does not cover offset 100
  for (const char* bad : {"boom", "eio:path", "eio:count=-1", "rate", "rate:mbps=0", "eio:mbps=3", "eio:size=1", ""}) {
    try {
      IoFaults::parse(bad, "DSV4_TEST_IO_FAULTS");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "DSV4_TEST_IO_FAULTS")) << e.what();
    }
  }
}

struct QueueRun {
  ReadOutcome outcome;
  double seconds = 0;
};

QueueRun read_through_queue(IoBackend backend, const std::shared_ptr<IoFaults>& faults, const File& file, uint8_t* dst,
                            uint64_t offset, uint64_t length) {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  QueueRun run;
  auto on_done = [&](uint64_t, const ReadOutcome& o) {
    std::lock_guard<std::mutex> lock(mutex);
    run.outcome = o;
    done = true;
    cv.notify_all();
  };
  std::unique_ptr<ReadQueue> q = backend == IoBackend::kUring ? make_uring_read_queue(2, on_done, faults)
                                                               : make_thread_read_queue(2, on_done, faults);
  ReadOp op;
  op.fd = op.buffered_fd = file.fd();
  op.shard = 5;
  op.path = &file.path();
  op.offset = offset;
  op.length = op.needed = length;
  op.dst = dst;
  const double t0 = IoFaults::now();
  q->submit(1, {op});
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [&] { return done; });
  run.seconds = IoFaults::now() - t0;
  return run;
}

// Both read queues fail, shorten, end or slow down exactly the reads the rules name.
TEST(IoFaults, BothReadQueuesObeyTheFaultLayer) {
  const std::string path = Checkpoint::open(fixture("tiny-a")).shards()[0]->path();
  File file = File::open_read(path);
  const uint64_t length = 64 << 10, offset = 8192;
  std::vector<uint8_t> want(length);
  file.read_exact(want.data(), length, offset);
  for (IoBackend backend : kBackends) {
    AlignedBuffer buffer(length);
    auto eio = IoFaults::parse("eio:path=" + path, "test");
    QueueRun r = read_through_queue(backend, eio, file, buffer.data(), offset, length);
    EXPECT_TRUE(contains(r.outcome.error, path)) << name(backend) << r.outcome.error;
    EXPECT_TRUE(contains(r.outcome.error, "Input/output error")) << r.outcome.error;
    EXPECT_EQ(r.outcome.failed_shard, 5);
    EXPECT_EQ(eio->injected(), 1u);

    r = read_through_queue(backend, IoFaults::parse("eof", "test"), file, buffer.data(), offset, length);
    EXPECT_TRUE(contains(r.outcome.error, "unexpected end of file")) << name(backend) << r.outcome.error;

    // Short reads: every one comes back half full; the queue continues until done.
    std::memset(buffer.data(), 0, length);
    r = read_through_queue(backend, IoFaults::parse("short:count=0", "test"), file, buffer.data(), offset, length);
    EXPECT_EQ(r.outcome.error, "") << name(backend);
    EXPECT_GE(r.outcome.requests, 4u) << name(backend);  // 64K -> 32K + 16K + 8K + 4K + 4K
    EXPECT_EQ(std::memcmp(buffer.data(), want.data(), length), 0) << name(backend);

    // 10 MB/s: 64 KiB take at least 6.5 ms.
    r = read_through_queue(backend, IoFaults::parse("rate:mbps=10", "test"), file, buffer.data(), offset, length);
    EXPECT_EQ(r.outcome.error, "");
    EXPECT_GE(r.seconds, 0.0065) << name(backend);
    EXPECT_EQ(std::memcmp(buffer.data(), want.data(), length), 0) << name(backend);
  }
}

// ---- the expert store -----------------------------------------------------------------------

// A failed read fails the acquire that needed it with one line naming the expert, its layer
// and the file; health says degraded until the expert reads again; nothing else is affected.
TEST(StoreFaults, AFailedReadFailsOnlyThatAcquire) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  for (IoBackend backend : kBackends) {
    for (const char* kind : {"eio", "eof"}) {
      ExpertStoreOptions o = store_options(backend);
      o.faults = IoFaults::parse(fault_on_expert(ck, kind, 4, 1), "test");
      ExpertStore store(ck, o);
      store.acquire(4, 0);
      store.release(4, 0);
      try {
        store.acquire(4, 1);
        FAIL() << "the faulty read must throw";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind("expert 1 of layer 4: ", 0), 0u) << msg;
        EXPECT_TRUE(contains(msg, locate_expert(ck, 4, 1).parts[0].shard->path())) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
      EXPECT_TRUE(contains(store.storage_problem(), "expert 1 of layer 4")) << store.storage_problem();
      const ExpertWeights& w = store.acquire(4, 1);  // count=1: the next read works
      expect_checkpoint_bytes(ck, w, 4, 1);
      store.release(4, 1);
      EXPECT_EQ(store.storage_problem(), "") << name(backend);
      EXPECT_EQ(store.stats().read_failures, 1u);
    }
  }
}

// Reads that come back short are continued: same bytes, more requests.
TEST(StoreFaults, ShortReadsAreContinued) {
  Checkpoint ck = Checkpoint::open(fixture("flashlike"));
  for (IoBackend backend : kBackends) {
    ExpertStoreOptions o = store_options(backend, 3);
    o.faults = IoFaults::parse("short:count=0", "test");
    ExpertStore store(ck, o);
    for (int e : {0, 8, 15}) {
      expect_checkpoint_bytes(ck, store.acquire(3, e), 3, e);
      store.release(3, e);
    }
    const ExpertStats s = store.stats();
    EXPECT_EQ(s.reads, 3u);
    EXPECT_GT(s.read_requests, 2 * s.read_windows) << name(backend);
  }
}

// The number of read requests per expert is the layout's minimum when nothing goes wrong.
TEST(StoreFaults, EachExpertIsReadInAsFewRequestsAsItsPlacementAllows) {
  Checkpoint ck = Checkpoint::open(fixture("flashlike"));
  ExpertStore store(ck, store_options(IoBackend::kUring, 3));
  for (int e : {0, 8, 15}) {
    store.acquire(3, e);
    store.release(3, e);
  }
  const ExpertStats s = store.stats();
  EXPECT_EQ(s.read_requests, s.read_windows);
  EXPECT_EQ(s.read_windows, 4u);  // expert 8 of layer 3 is split over two shards
}

// With a mirror, a read the checkpoint's copy cannot serve is served by the mirror: the
// request succeeds with the checkpoint's bytes.
TEST(StoreFaults, AMirrorServesWhatTheCheckpointCannot) {
  Copy primary("tiny-a"), mirror("tiny-a", "mirror");
  Checkpoint ck = Checkpoint::open(primary.dir);
  for (IoBackend backend : kBackends) {
    ExpertStoreOptions o = store_options(backend);
    o.mirrors = {mirror.dir};
    o.read_shares = {1, 0};  // everything from the checkpoint's folder, unless it fails
    o.faults = IoFaults::parse("eio:count=0:path=" + primary.dir + "/", "test");
    ExpertStore store(ck, o);
    for (int l : {0, 3, 5})
      for (int e = 0; e < 4; ++e) {
        expect_checkpoint_bytes(ck, store.acquire(l, e), l, e);
        store.release(l, e);
      }
    const ExpertStats s = store.stats();
    EXPECT_EQ(s.read_failures, 0u);
    EXPECT_EQ(s.read_retries, s.reads) << name(backend);  // each expert once from the mirror
    EXPECT_EQ(store.storage_problem(), "");
  }
}

TEST(StoreFaults, MirrorsMustBeIdenticalCopies) {
  Copy primary("tiny-a"), mirror("tiny-a", "mirror");
  Checkpoint ck = Checkpoint::open(primary.dir);
  const std::string shard = fs::path(ck.shards()[1]->path()).filename().string();
  auto refused = [&](const std::string& dir, const std::string& needle) {
    ExpertStoreOptions o = store_options(IoBackend::kThreads);
    o.mirrors = {dir};
    try {
      ExpertStore store(ck, o);
      ADD_FAILURE() << "mirror " << dir << " was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), needle)) << e.what();
    }
  };
  refused(primary.tmp / "nowhere", "not a directory");
  fs::create_directories(primary.tmp / "empty");
  refused(primary.tmp / "empty", "holds none of the checkpoint's shards");
  refused(primary.dir, "is the same folder");
  // A mirror may hold only some shards (a checkpoint spread over folders); those it holds
  // must match.
  fs::remove(mirror.dir + "/model-00001-of-00003.safetensors");
  ExpertStoreOptions partial = store_options(IoBackend::kThreads);
  partial.mirrors = {mirror.dir};
  EXPECT_NO_THROW(ExpertStore(ck, partial));
  ASSERT_EQ(::truncate((mirror.dir + "/" + shard).c_str(), 100000), 0);
  refused(mirror.dir, mirror.dir + "/" + shard);
  test::write_file(mirror.dir + "/config.json", "{}");
  refused(mirror.dir, "config.json differs");
}

// The command line checks --mirror folders whatever the RAM plan: with every expert resident
// (--ram 4G on tiny-a) no mirror is read, yet a missing folder or a truncated shard in one is
// refused at start with one error line naming the folder or the file, and exit status 1.
TEST(StoreFaults, MirrorsAreCheckedWhenEveryExpertIsResident) {
  Copy primary("tiny-a"), mirror("tiny-a", "mirror");
  Checkpoint ck = Checkpoint::open(primary.dir);
  const std::string shard = fs::path(ck.shards()[1]->path()).filename().string();
  auto generate = [&](const std::string& mirror_dir) {
    return test::run_dsv4("generate -m " + primary.dir + " --tokens 1,2 -n 1 --ram 4G --mirror " + mirror_dir);
  };
  auto error_lines = [](const std::string& err) {
    int n = 0;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);) n += contains(l, "error");
    return n;
  };
  const test::CommandResult good = generate(mirror.dir);
  EXPECT_EQ(good.exit_code, 0) << good.err;
  const test::CommandResult missing = generate(primary.tmp / "nowhere");
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
  EXPECT_TRUE(contains(missing.err, "dsv4: error: --mirror " + (primary.tmp / "nowhere") + ": not a directory"))
      << missing.err;
  EXPECT_EQ(error_lines(missing.err), 1) << missing.err;
  ASSERT_EQ(::truncate((mirror.dir + "/" + shard).c_str(), 100000), 0);
  const test::CommandResult truncated = generate(mirror.dir);
  EXPECT_EQ(truncated.exit_code, 1) << truncated.err;
  EXPECT_TRUE(contains(truncated.err, "dsv4: error: " + mirror.dir + "/" + shard + ": mirror copy is 100000 bytes"))
      << truncated.err;
  EXPECT_EQ(error_lines(truncated.err), 1) << truncated.err;
}

// Each expert is read from one folder, chosen deterministically, in proportion to the
// folders' read shares (given, or measured at start).
TEST(StoreFaults, ReadSharesSplitTheExperts) {
  Copy primary("flashlike"), mirror("flashlike", "mirror");
  Checkpoint ck = Checkpoint::open(primary.dir);
  ExpertStoreOptions o = store_options(IoBackend::kUring);
  o.mirrors = {mirror.dir};
  o.read_shares = {3, 1};
  ExpertStore store(ck, o);
  const int layers = static_cast<int>(ck.config().layers.size()), E = ck.config().n_routed_experts;
  int first = 0;
  for (int l = 0; l < layers; ++l)
    for (int e = 0; e < E; ++e) first += store.folder_of(l, e) == 0;
  EXPECT_NEAR(double(first) / (layers * E), 0.75, 0.02);
  ExpertStore again(ck, o);
  for (int e = 0; e < E; ++e) EXPECT_EQ(again.folder_of(2, e), store.folder_of(2, e));  // deterministic

  o.read_shares.clear();  // measured: both folders serve some
  ExpertStore measured(ck, o);
  ASSERT_EQ(measured.read_shares().size(), 2u);
  EXPECT_GT(measured.read_shares()[0], 0.0);
  EXPECT_GT(measured.read_shares()[1], 0.0);
  EXPECT_NEAR(measured.read_shares()[0] + measured.read_shares()[1], 1.0, 1e-9);
}

// Windows of at least two minimum pieces are read in pieces from both folders at once, in
// proportion to the shares: every folder works on every expert (so the reads of a pass end
// together), the bytes are the checkpoint's, and a piece that fails is read from another copy.
TEST(StoreFaults, LargeWindowsAreSplitOverTheFolders) {
  Copy primary("tiny-a"), mirror("tiny-a", "mirror");
  Checkpoint ck = Checkpoint::open(primary.dir);
  const int layers = ck.config().n_main_layers(), E = ck.config().n_routed_experts;
  for (IoBackend backend : kBackends) {
    SCOPED_TRACE(name(backend));
    for (const std::vector<double>& shares : {std::vector<double>{1, 1}, std::vector<double>{3, 1}}) {
      for (const std::string& failing : {std::string(), primary.dir, mirror.dir}) {
        SCOPED_TRACE(shares[0]);
        SCOPED_TRACE(failing);
        ExpertStoreOptions o = store_options(backend);
        o.mirrors = {mirror.dir};
        o.read_shares = shares;
        o.min_piece_bytes = 4096;
        if (!failing.empty()) o.faults = IoFaults::parse("eio:count=0:path=" + failing + "/", "test");
        ExpertStore store(ck, o);
        for (int l = 0; l < layers; ++l)
          for (int e = 0; e < E; ++e) {
            expect_checkpoint_bytes(ck, store.acquire(l, e), l, e);
            store.release(l, e);
          }
        const ExpertStats s = store.stats();
        EXPECT_EQ(s.reads, uint64_t(layers * E));
        EXPECT_EQ(s.read_failures, 0u);
        ASSERT_EQ(s.folder_bytes.size(), 2u);
        if (failing.empty()) {
          // Every window (~28 KiB) in two pieces (3:1: but one whose quarter is under 4 KiB).
          if (shares[0] == shares[1]) {
            EXPECT_EQ(s.read_pieces, 2 * s.read_windows);
          } else {
            EXPECT_GT(s.read_pieces, 2 * s.read_windows - 4);
          }
          EXPECT_EQ(s.read_requests, s.read_pieces);
          EXPECT_EQ(s.read_retries, 0u);
          EXPECT_EQ(s.folder_bytes[0] + s.folder_bytes[1], s.bytes_read);
          // In proportion to the shares, up to the 4 KiB grid of each cut.
          const double first = double(s.folder_bytes[0]) / double(s.bytes_read);
          EXPECT_NEAR(first, shares[0] / (shares[0] + shares[1]), 4096.0 / (double(s.bytes_read) / s.reads));
        } else {
          // Each window once more, whole from the other folder (an expert over two shards
          // finds its second window's failing copy on the second try).
          EXPECT_GE(s.read_retries, s.reads);
          EXPECT_LE(s.read_retries, s.read_windows);
          EXPECT_EQ(s.folder_bytes[failing == primary.dir ? 0 : 1], 0u);
          EXPECT_EQ(s.folder_bytes[failing == primary.dir ? 1 : 0], s.bytes_read);
        }
      }
    }
  }
}

// Windows too small to split go whole to the folder with the least queued bytes: four reads
// started at once are shared two and two, whatever the experts' preferred folders.
TEST(StoreFaults, WholeWindowsGoToTheLeastLoadedFolder) {
  Copy primary("tiny-a"), mirror("tiny-a", "mirror");
  Checkpoint ck = Checkpoint::open(primary.dir);
  for (IoBackend backend : kBackends) {
    SCOPED_TRACE(name(backend));
    ExpertStoreOptions o = store_options(backend, 8);
    o.mirrors = {mirror.dir};
    o.read_shares = {1, 1};
    o.queue_depth = 4;
    ExpertStore store(ck, o);
    const int layer = 3;
    const std::vector<int> experts = {0, 1, 2, 3};
    int preferred_first = 0;
    for (int e : experts) preferred_first += store.folder_of(layer, e) == 0;
    store.prefetch(layer, experts);
    for (int e : experts) {
      expect_checkpoint_bytes(ck, store.acquire(layer, e), layer, e);
      store.release(layer, e);
    }
    const ExpertStats s = store.stats();
    EXPECT_EQ(s.read_pieces, s.read_windows);  // whole windows
    const uint64_t window = s.bytes_read / s.reads;
    EXPECT_GT(s.folder_bytes[0], window) << preferred_first;  // two each (sizes differ by a few KiB)
    EXPECT_GT(s.folder_bytes[1], window) << preferred_first;
    EXPECT_LT(s.folder_bytes[0], 3 * window);
  }
}

// A bad scale in one copy, wherever the cut between the pieces falls: the copy whose piece
// brought the bad byte is blamed, and the read is served by the other copy with the
// checkpoint's bytes. (Blaming the wrong copy would leave only the corrupt one to retry on.)
TEST(StoreFaults, ABadScaleBlamesThePieceThatBroughtIt) {
  Copy clean("tiny-a", "clean");
  const Checkpoint want = Checkpoint::open(clean.dir);
  const ExpertLocation loc = locate_expert(want, 2, 5);
  uint64_t retried = 0;
  for (int part : {1, 3, 5}) {
    for (bool at_end : {false, true}) {
      for (bool in_mirror : {false, true}) {
        SCOPED_TRACE(fmt::format("part {} {} in {}", part, at_end ? "end" : "start", in_mirror ? "mirror" : "primary"));
        Copy primary("tiny-a"), mirror("tiny-a", "mirror");
        const uint64_t byte = loc.parts[part].offset + (at_end ? loc.parts[part].bytes - 1 : 0);
        const std::string name = fs::path(loc.parts[part].shard->path()).filename().string();
        poke((in_mirror ? mirror.dir : primary.dir) + "/" + name, byte, 0xFF);
        Checkpoint ck = Checkpoint::open(primary.dir);
        ExpertStoreOptions o = store_options(IoBackend::kUring);
        o.mirrors = {mirror.dir};
        o.read_shares = {1, 1};
        o.min_piece_bytes = 4096;
        ExpertStore store(ck, o);
        expect_checkpoint_bytes(want, store.acquire(2, 5), 2, 5);
        store.release(2, 5);
        EXPECT_EQ(store.stats().read_failures, 0u);
        retried += store.stats().read_retries;
      }
    }
  }
  EXPECT_EQ(retried, 6u);  // each bad byte came from the corrupt copy in one case of its pair
}

// ---- shards that change under the engine ------------------------------------------------------

// Truncated in place: refused (even reads that would still find their bytes) with a line
// naming the shard; restored the usual atomic way (copy, then mv over): reopened, no restart.
TEST(ShardWatch, TruncatedShardIsRefusedAndAnMvRestoreRecovers) {
  for (IoBackend backend : kBackends) {
    Copy c("tiny-a");
    Checkpoint ck = Checkpoint::open(c.dir);
    ExpertStore store(ck, store_options(backend, 2));
    const ExpertLocation loc = locate_expert(ck, 1, 0);
    const std::string shard = loc.parts[0].shard->path();
    store.acquire(1, 0);
    store.release(1, 0);
    fs::copy_file(fixture("tiny-a") + "/" + fs::path(shard).filename().string(), c.tmp / "good");
    fs::permissions(c.tmp / "good", fs::perms::owner_write, fs::perm_options::add);
    ASSERT_EQ(::truncate(shard.c_str(), static_cast<off_t>(fs::file_size(shard) - 1)), 0);
    for (int e : {1, 2, 3}) {  // new reads from that shard (the last bytes are not theirs)
      ASSERT_EQ(locate_expert(ck, 1, e).parts[0].shard->path(), shard);
      try {
        store.acquire(1, e);
        FAIL() << "a read from a truncated shard must fail";
      } catch (const Error& err) {
        EXPECT_TRUE(contains(err.what(), "expert " + std::to_string(e) + " of layer 1")) << err.what();
        EXPECT_TRUE(contains(err.what(), shard + ": the shard changed size under the engine")) << err.what();
      }
    }
    EXPECT_TRUE(contains(store.storage_problem(), "changed size")) << store.storage_problem();
    fs::rename(c.tmp / "good", shard);  // the mv
    for (int e : {1, 2, 3}) {
      expect_checkpoint_bytes(Checkpoint::open(fixture("tiny-a")), store.acquire(1, e), 1, e);
      store.release(1, e);
    }
    EXPECT_EQ(store.storage_problem(), "");
  }
}

// A path that now names a different file: refused until the right file is back.
TEST(ShardWatch, AShardReplacedByAnotherFileIsRefused) {
  Copy c("tiny-a"), other("flashlike", "other");
  Checkpoint ck = Checkpoint::open(c.dir);
  ExpertStore store(ck, store_options(IoBackend::kUring, 2));
  const std::string shard = locate_expert(ck, 2, 0).parts[0].shard->path();
  const std::string name = fs::path(shard).filename().string();
  fs::rename(other.dir + "/" + name, shard);
  try {
    store.acquire(2, 0);
    FAIL() << "a read from a replaced shard must fail";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "expert 0 of layer 2: " + shard + ": replaced by a file")) << e.what();
  }
  EXPECT_TRUE(contains(store.storage_problem(), "replaced by a file")) << store.storage_problem();
  fs::copy_file(fixture("tiny-a") + "/" + name, c.tmp / "good");
  fs::rename(c.tmp / "good", shard);
  store.acquire(2, 0);
  store.release(2, 0);
  EXPECT_EQ(store.storage_problem(), "");
}

// A deleted shard is reported; the open file still reads (its bytes are the loaded ones).
TEST(ShardWatch, ADeletedShardIsReported) {
  Copy c("tiny-a");
  Checkpoint ck = Checkpoint::open(c.dir);
  ExpertStore store(ck, store_options(IoBackend::kThreads, 2));
  const std::string shard = locate_expert(ck, 3, 0).parts[0].shard->path();
  fs::remove(shard);
  const std::string problem = store.storage_problem();
  EXPECT_TRUE(contains(problem, shard + ": deleted from disk")) << problem;
  expect_checkpoint_bytes(Checkpoint::open(fixture("tiny-a")), store.acquire(3, 0), 3, 0);
  store.release(3, 0);
}

// ---- values checked when the bytes arrive -----------------------------------------------------

struct BadScale {
  int layer = 2, expert = 5;
  uint8_t code;
};

std::string corrupt_scale(const std::string& dir, const BadScale& b) {
  Checkpoint ck = Checkpoint::open(dir);
  const ExpertLocation loc = locate_expert(ck, b.layer, b.expert);
  poke(loc.parts[3].shard->path(), loc.parts[3].offset + 7, b.code);  // w3.scale, index 7
  return loc.parts[3].shard->path();
}

std::vector<int32_t> short_prompt() { return {496, 499}; }

// Teacher-forced logits of a prompt (throws what the engine throws).
std::vector<float> score(Engine& e, const std::vector<int32_t>& tokens) {
  std::vector<float> logits(tokens.size() * e.config().vocab_size);
  SessionState s = e.new_session();
  e.forward(s, tokens, logits.data(), LogitRows::kAll, 4);
  return logits;
}

// Every routed expert of every layer is used by this prompt in prefill (checked below), so a
// bad expert anywhere is met.
std::vector<int32_t> long_prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 120; ++i) p.push_back((i * 37 + 11) % 500);
  return p;
}

TEST(ExpertValues, AnOutOfRangeScaleIsAnErrorNamingLayerAndExpert) {
  for (uint8_t code : {uint8_t{0xFF}, uint8_t{0xFE}, uint8_t{127 + 33}}) {
    Copy c("tiny-a");
    const BadScale bad{2, 5, code};
    const std::string shard = corrupt_scale(c.dir, bad);
    const std::string where = "expert 5 of layer 2: " + shard + ": tensor layers.2.ffn.experts.5.w3.scale holds the "
                              "E8M0 scale ";
    // Resident: refused at load.
    EngineOptions resident;
    resident.numerics = kernels::Numerics::kReference;
    resident.threads = 1;
    try {
      test::open_engine(c.dir, resident);
      ADD_FAILURE() << "a resident bad scale must fail the load";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), where)) << e.what();
      EXPECT_TRUE(contains(e.what(), "at index 7")) << e.what();
    }
    // Streamed, both read queues: the request that needs it fails; no NaN comes out.
    for (IoBackend backend : kBackends) {
      auto engine = load_engine(c.dir, streamed(backend)).engine;
      try {
        score(*engine, long_prompt());
        ADD_FAILURE() << "a streamed bad scale must fail the request";
      } catch (const Error& e) {
        EXPECT_TRUE(contains(e.what(), where + (code == 0xFF ? "0xFF (NaN)" : code == 0xFE ? "0xFE (2^127)" : "0xA0")))
            << e.what();
      }
      EXPECT_TRUE(contains(engine->experts().storage_problem(), "expert 5 of layer 2")) << name(backend);
      // A prompt that does not need the expert still works (and the engine's state is fine).
      const std::vector<float> logits = score(*engine, short_prompt());
      for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// The long prompt meets the corrupted expert, the short one does not (so the test above
// cannot pass by luck).
TEST(ExpertValues, TheLongPromptUsesTheCorruptedExpert) {
  EngineOptions o;
  o.numerics = kernels::Numerics::kReference;
  o.threads = 1;
  auto recording = std::make_unique<RecordingExperts>(Checkpoint::open(fixture("tiny-a")));
  RecordingExperts* r = recording.get();
  auto engine = test::open_engine(fixture("tiny-a"), o, std::move(recording));
  auto uses = [&](const std::vector<int32_t>& prompt) {
    r->acquired.clear();
    score(*engine, prompt);
    return std::find(r->acquired.begin(), r->acquired.end(), std::pair{2, 5}) != r->acquired.end();
  };
  EXPECT_TRUE(uses(long_prompt()));
  EXPECT_FALSE(uses(short_prompt()));
}

TEST(ExpertValues, TheCliExitsNonZeroAndInspectDeepNamesIt) {
  Copy c("tiny-a");
  const std::string shard = corrupt_scale(c.dir, {2, 5, 0xFE});
  std::string tokens;
  for (int32_t t : long_prompt()) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  for (const char* ram : {"64G", "min"}) {
    auto r = test::run_dsv4("generate -m " + c.dir + " --tokens " + tokens + " -n 2 --ram " + ram);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(contains(r.err, "dsv4: error: expert 5 of layer 2: " + shard)) << r.err;
    EXPECT_EQ(r.out, "");
  }
  auto plain = test::run_dsv4("inspect " + c.dir);  // headers only: fine
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  auto deep = test::run_dsv4("inspect --deep " + c.dir);
  EXPECT_EQ(deep.exit_code, 1);
  EXPECT_TRUE(contains(deep.err, "dsv4: error: expert 5 of layer 2: " + shard +
                                     ": tensor layers.2.ffn.experts.5.w3.scale holds the E8M0 scale 0xFE (2^127)"))
      << deep.err;
  EXPECT_TRUE(contains(deep.err, "inspect --deep:")) << deep.err;  // the progress lines
  auto deep_json = test::run_dsv4("inspect --deep --json " + c.dir);
  EXPECT_EQ(deep_json.exit_code, 1);
  EXPECT_EQ(nlohmann::json::parse(deep_json.out)["value_problems"].size(), 1u);
  auto clean = test::run_dsv4("inspect --deep " + fixture("flashlike"));
  EXPECT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_TRUE(contains(clean.out, "every tensor's values checked")) << clean.out;
}

// inspect --deep checks dense tensors too: a NaN code in an FP8 weight, a BF16 infinity.
TEST(ExpertValues, InspectDeepChecksEveryTensor) {
  Copy c("tiny-a");
  Checkpoint ck = Checkpoint::open(c.dir);
  const TensorRef& wq = ck.get("layers.1.attn.wq_a.weight");
  poke(wq.shard->path(), wq.info->offset + 3, 0x7F);
  const TensorRef& head = ck.get("head.weight");
  poke(head.shard->path(), head.info->offset + 11, 0x7F);  // BF16 0x7Fxx at element 5: high byte
  poke(head.shard->path(), head.info->offset + 10, 0x80);  // 0x7F80 = +Inf
  auto r = test::run_dsv4("inspect --deep " + c.dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "tensor layers.1.attn.wq_a.weight holds a NaN encoding (0x7F) at index 3")) << r.err;
  EXPECT_TRUE(contains(r.err, "tensor head.weight holds a non-finite value at index 5")) << r.err;
  EXPECT_TRUE(contains(r.err, "2 tensors with bad values")) << r.err;
}

// An expert whose output is not finite (here: a provider that hands out weights with a huge
// scale, past the validation) stops the request naming the layer and the expert.
class CorruptingExperts final : public ExpertProvider {
 public:
  CorruptingExperts(const Checkpoint& ck, int layer, int expert)
      : inner_(make_resident_experts(ck)), layer_(layer), expert_(expert) {}
  void prefetch(int layer, std::span<const int> experts) override { inner_->prefetch(layer, experts); }
  const ExpertWeights& acquire(int layer, int expert) override {
    const ExpertWeights& w = inner_->acquire(layer, expert);
    if (layer != layer_ || expert != expert_) return w;
    bad_ = w;
    scales_.assign(w.w2.scales, w.w2.scales + w.w2.scale_bytes());
    std::fill(scales_.begin(), scales_.end(), uint8_t{0xFE});
    bad_.w2.scales = scales_.data();
    return bad_;
  }
  void release(int layer, int expert) override { inner_->release(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }

 private:
  std::unique_ptr<ExpertProvider> inner_;
  int layer_, expert_;
  ExpertWeights bad_;
  std::vector<uint8_t> scales_;
};

TEST(NonFinite, AnExpertsNonFiniteOutputNamesLayerAndExpert) {
  EngineOptions o;
  o.numerics = kernels::Numerics::kReference;
  o.threads = 1;
  auto engine = test::open_engine(fixture("tiny-a"), o,
                                  std::make_unique<CorruptingExperts>(Checkpoint::open(fixture("tiny-a")), 2, 5));
  try {
    score(*engine, long_prompt());
    FAIL() << "a non-finite expert output must stop the forward pass";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("layer 2: routed expert 5 produced a non-finite value (token ", 0), 0u)
        << e.what();
  }
}

// ---- faults at each point of a streamed generation ---------------------------------------------

GenerationResult greedy(Engine& e, const std::vector<int32_t>& prompt, int n) {
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = n;
  r.chunk = 4;
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  SessionState s = e.new_session();
  return generate(e, s, r, cb);
}


// An expert first needed in prefill, and one first needed in decode, of greedy(prompt, 6).
struct FirstUses {
  std::pair<int, int> prefill, decode;
  std::vector<int32_t> tokens;  // the fault-free output
};

FirstUses first_uses(const std::string& dir, const std::vector<int32_t>& prompt, int n) {
  auto recording = std::make_unique<RecordingExperts>(Checkpoint::open(dir));
  RecordingExperts* t = recording.get();
  EngineOptions o;
  o.numerics = kernels::Numerics::kReference;
  o.threads = 1;
  auto engine = test::open_engine(dir, o, std::move(recording));
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = 1;
  r.chunk = 4;
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t) { return std::string(); };
  SessionState s = engine->new_session();
  generate(*engine, s, r, cb);  // prefill only
  const std::set<std::pair<int, int>> in_prefill(t->acquired.begin(), t->acquired.end());
  FirstUses f;
  f.prefill = *in_prefill.begin();
  const size_t seen = t->acquired.size();
  f.tokens = greedy(*engine, prompt, n).tokens;
  bool found = false;
  for (size_t i = seen; i < t->acquired.size() && !found; ++i) {
    if (!in_prefill.count(t->acquired[i])) {
      f.decode = t->acquired[i];
      found = true;
    }
  }
  EXPECT_TRUE(found) << "no expert is first needed in decode";
  return f;
}

// At load (dense weights), prefill and decode, with either read queue: the generation fails
// with the error naming the expert and file; the same engine then serves the next request;
// and with a mirror the output is bit-identical to the fault-free run.
TEST(StorageFaults, AtEveryPointOfAStreamedGeneration) {
  Copy primary("tiny-a"), mirror("tiny-a", "mirror");
  const std::vector<int32_t> prompt = {496, 499, 84, 101, 288};
  const FirstUses uses = first_uses(primary.dir, prompt, 6);
  Checkpoint ck = Checkpoint::open(primary.dir);
  for (IoBackend backend : kBackends) {
    SCOPED_TRACE(name(backend));
    // Load: a dense tensor's read fails; the engine does not open.
    const TensorRef& head = ck.get("head.weight");
    auto load_fault = IoFaults::parse(fmt::format("eio:path={}:offset={}", head.shard->path(), head.info->offset + 100),
                                      "test");
    try {
      load_engine(primary.dir, streamed(backend, load_fault));
      ADD_FAILURE() << "a failed read at load must fail the load";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), head.shard->path())) << e.what();
      EXPECT_TRUE(contains(e.what(), "Input/output error")) << e.what();
    }
    for (const auto& [point, expert] : {std::pair{"prefill", uses.prefill}, std::pair{"decode", uses.decode}}) {
      SCOPED_TRACE(point);
      for (const char* kind : {"eio", "eof"}) {
        auto faults = IoFaults::parse(fault_on_expert(ck, kind, expert.first, expert.second, ":count=0"), "test");
        auto engine = load_engine(primary.dir, streamed(backend, faults)).engine;
        try {
          greedy(*engine, prompt, 6);
          ADD_FAILURE() << "the generation must fail";
        } catch (const Error& e) {
          EXPECT_TRUE(contains(e.what(), fmt::format("expert {} of layer {}: {}", expert.second, expert.first,
                                                     locate_expert(ck, expert.first, expert.second).parts[0].shard->path())))
              << e.what();
        }
        faults->clear();
        EXPECT_EQ(greedy(*engine, prompt, 6).tokens, uses.tokens);  // the next request works

        // With a mirror the failing read is served there: same tokens, no error. (Every read
        // tries the checkpoint's folder first, so the fault is met.)
        LoadOptions with_mirror = streamed(backend, IoFaults::parse(fault_on_expert(ck, kind, expert.first,
                                                                                      expert.second, ":count=0"),
                                                                      "test"));
        with_mirror.store.mirrors = {mirror.dir};
        with_mirror.store.read_shares = {1, 0};
        auto mirrored = load_engine(primary.dir, with_mirror).engine;
        EXPECT_EQ(greedy(*mirrored, prompt, 6).tokens, uses.tokens);
        EXPECT_GE(mirrored->experts().stats().read_retries, 1u);
      }
    }
  }
}

// A read fault during a speculative verify pass of several draft rows: the generation fails
// with the expert's error, and the session (which held an earlier turn) is rewound bit for bit
// to where the generation started; the same session then gives the fault-free tokens.
TEST(StorageFaults, AFailedVerifyPassRewindsTheSession) {
  Copy primary("tiny-a");
  const std::vector<int32_t> prompt = {496, 499, 84, 101, 288};
  const FirstUses uses = first_uses(primary.dir, prompt, 6);
  Checkpoint ck = Checkpoint::open(primary.dir);
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = 6;
  r.chunk = 4;
  // Oracle drafts, all right: the first decode pass feeds the first token and 4 drafts, every
  // decode feed of greedy(prompt, 6), so the expert first needed in decode fails inside it.
  r.spec = SpecMode::kOracle;
  r.draft_max = 4;
  r.oracle = uses.tokens;
  GenerationCallbacks cb;
  cb.detokenize = [](int32_t id) { return "<" + std::to_string(id) + ">"; };
  for (IoBackend backend : kBackends) {
    SCOPED_TRACE(name(backend));
    auto faults = IoFaults::parse(fault_on_expert(ck, "eio", uses.decode.first, uses.decode.second, ":count=0"), "test");
    auto engine = load_engine(primary.dir, streamed(backend, faults)).engine;
    SessionState s = engine->new_session();
    // An earlier turn: the prompt's first tokens (their experts are a subset of the prefill's).
    engine->forward(s, std::span<const int32_t>(prompt).first(3), nullptr, LogitRows::kLast);
    const SessionState before = s;
    try {
      generate(*engine, s, r, cb);
      ADD_FAILURE() << "the generation must fail";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), fmt::format("expert {} of layer {}", uses.decode.second, uses.decode.first)))
          << e.what();
    }
    test::expect_same_session(s, before);
    faults->clear();
    const GenerationResult again = generate(*engine, s, r, cb);
    EXPECT_EQ(again.tokens, uses.tokens);
    EXPECT_GT(again.stats.accepted_tokens, 0);
  }
}

// Logits with mirrors (experts shared between the folders whole, or each read in pieces from
// both, and with every read of the checkpoint's folder failing) are bit-identical to the
// resident ones, on every fixture.
TEST(StorageFaults, MirrorsGiveBitIdenticalLogits) {
  for (const char* fixture_name : {"tiny-a", "flashlike"}) {
    SCOPED_TRACE(fixture_name);
    Copy primary(fixture_name), mirror(fixture_name, "mirror");
    const std::vector<int32_t> tokens = long_prompt();
    EngineOptions resident;
    resident.numerics = kernels::Numerics::kReference;
    resident.threads = 1;
    const std::vector<float> want = score(*test::open_engine(primary.dir, resident), tokens);
    const Checkpoint ck = Checkpoint::open(primary.dir);
    for (const char* mode : {"whole", "split", "failing"}) {
      SCOPED_TRACE(mode);
      const bool failing = std::string(mode) == "failing";
      auto faults = std::make_shared<IoFaults>();
      LoadOptions o = streamed(IoBackend::kAuto, faults);
      o.store.mirrors = {mirror.dir};
      o.store.read_shares = {1, 1};
      if (std::string(mode) != "whole") o.store.min_piece_bytes = 4096;  // windows in pieces from both folders
      auto engine = load_engine(primary.dir, o).engine;
      // The checkpoint's drive fails after the load: every read of its expert shards fails.
      // (The embedding's shard is left alone: embedding rows are read from the checkpoint's
      // own copy, and only expert reads go to mirrors.)
      if (failing) {
        const std::string embed = ck.get("embed.weight").shard->path();
        std::string rules;
        for (const auto& shard : ck.shards())
          if (shard->path() != embed) rules += "eio:count=0:path=" + shard->path() + ";";
        faults->set_rules(IoFaults::parse_rules(rules, "test"));
      }
      const std::vector<float> got = score(*engine, tokens);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
      const ExpertStats st = engine->experts().stats();
      ASSERT_EQ(st.folder_bytes.size(), 2u);
      EXPECT_GT(st.folder_bytes[1], 0u);  // the mirror served reads
      if (!failing) {
        EXPECT_GT(st.folder_bytes[0], 0u);
      }
      if (std::string(mode) == "whole") {
        EXPECT_EQ(st.read_pieces, st.read_windows);
      } else if (std::string(mode) == "split") {
        EXPECT_GT(st.read_pieces, st.read_windows);
      }
    }
  }
}

// The command line: a fault at load, prefill or decode exits 1 with the one-line error.
TEST(StorageFaults, TheCliExitsNonZeroWithTheSameMessage) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  const ExpertLocation loc = locate_expert(ck, 1, 0);
  const std::string rule = fault_on_expert(ck, "eio", 1, 0, ":count=0");
  ::setenv("DSV4_TEST_IO_FAULTS", rule.c_str(), 1);
  auto r = test::run_dsv4("generate -m " + fixture("tiny-a") + " --tokens " +
                          [] {
                            std::string s;
                            for (int32_t t : long_prompt()) s += (s.empty() ? "" : ",") + std::to_string(t);
                            return s;
                          }() +
                          " -n 2 --ram min");
  ::setenv("DSV4_TEST_IO_FAULTS", "eio:count=x", 1);
  auto bad = test::run_dsv4("generate -m " + fixture("tiny-a") + " --tokens 1,2 -n 1 --ram min");
  ::unsetenv("DSV4_TEST_IO_FAULTS");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "dsv4: error: expert 0 of layer 1: " + loc.parts[0].shard->path() +
                                  ": expert read of ")) << r.err;
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(contains(bad.err, "DSV4_TEST_IO_FAULTS")) << bad.err;
}

// ---- the server ------------------------------------------------------------------------------

// A request whose expert read fails gets a 5xx JSON error (or an error event when streaming)
// naming the expert; /health says degraded with the reason; once the fault is gone the server
// answers the same request as a fault-free server, and /health is ok again.
TEST(StorageFaults, TheServerFailsTheRequestAndKeepsServing) {
  Checkpoint ck = Checkpoint::open(fixture("tiny-a"));
  text::Tokenizer tokenizer = text::Tokenizer::from_file(fixture("tiny-a") + "/tokenizer.json");
  const std::string prompt = "Hi";
  // /v1/completions puts the BOS in front of a text prompt.
  const FirstUses uses = first_uses(fixture("tiny-a"), tokenizer.encode(std::string(text::chat::kBos) + prompt), 6);
  for (IoBackend backend : kBackends) {
    for (const auto& expert : {uses.prefill, uses.decode}) {
      SCOPED_TRACE(fmt::format("{} expert {} of layer {}", name(backend), expert.second, expert.first));
      auto faults = IoFaults::parse(fault_on_expert(ck, "eio", expert.first, expert.second, ":count=0"), "test");
      auto engine = load_engine(fixture("tiny-a"), streamed(backend, faults)).engine;
      server::ServerOptions so;
      so.host = "127.0.0.1";
      so.port = 0;
      so.model_name = "tiny-a";
      so.defaults.vocab_size = static_cast<int32_t>(engine->config().vocab_size);
      server::Server server(*engine, tokenizer, so);
      const int port = server.bind();
      server.start();
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(120);
      nlohmann::json body = {{"model", "tiny-a"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}};
      auto r = client.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 500);
      const auto error = nlohmann::json::parse(r->body, nullptr, false);
      EXPECT_EQ(error["error"]["type"], "server_error") << r->body;
      EXPECT_TRUE(contains(error["error"]["message"].get<std::string>(),
                           fmt::format("expert {} of layer {}: ", expert.second, expert.first)))
          << r->body;
      body["stream"] = true;
      auto sr = client.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(sr);
      EXPECT_TRUE(contains(sr->body, "\"server_error\"")) << sr->body;
      auto health = nlohmann::json::parse(client.Get("/health")->body);
      EXPECT_EQ(health["status"], "degraded");
      EXPECT_TRUE(contains(health["reason"].get<std::string>(), fmt::format("expert {} of layer {}", expert.second,
                                                                          expert.first)))
          << health.dump();
      faults->clear();
      body["stream"] = false;
      auto ok = client.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(ok);
      EXPECT_EQ(ok->status, 200) << ok->body;
      EXPECT_EQ(nlohmann::json::parse(ok->body)["usage"]["completion_tokens"], 6);
      EXPECT_EQ(nlohmann::json::parse(client.Get("/health")->body)["status"], "ok");
      server.stop();
    }
  }
}

// A bad expert scale (0xFF NaN, 0xFE 2^127) met by a streamed request: a 5xx JSON error naming
// the layer and expert, no logits; /health says degraded; a request that does not need the
// expert is still answered.
TEST(ExpertValues, TheServerAnswersABadScaleWith5xxJson) {
  for (uint8_t code : {uint8_t{0xFF}, uint8_t{0xFE}}) {
    SCOPED_TRACE(static_cast<int>(code));
    Copy c("tiny-a");
    corrupt_scale(c.dir, {2, 5, code});
    text::Tokenizer tokenizer = text::Tokenizer::from_file(fixture("tiny-a") + "/tokenizer.json");
    auto engine = load_engine(c.dir, streamed(IoBackend::kAuto)).engine;
    server::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.model_name = "tiny-a";
    so.defaults.vocab_size = static_cast<int32_t>(engine->config().vocab_size);
    server::Server server(*engine, tokenizer, so);
    const int port = server.bind();
    server.start();
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(120);
    nlohmann::json body = {{"model", "tiny-a"}, {"prompt", long_prompt()}, {"max_tokens", 2}, {"temperature", 0}};
    auto r = client.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_GE(r->status, 500);
    const auto error = nlohmann::json::parse(r->body, nullptr, false);
    ASSERT_TRUE(error.is_object()) << r->body;
    EXPECT_TRUE(contains(error["error"]["message"].get<std::string>(), "expert 5 of layer 2: ")) << r->body;
    EXPECT_TRUE(contains(error["error"]["message"].get<std::string>(), "E8M0 scale")) << r->body;
    EXPECT_FALSE(error.contains("choices")) << r->body;
    EXPECT_EQ(nlohmann::json::parse(client.Get("/health")->body)["status"], "degraded");
    body["prompt"] = short_prompt();
    auto ok = client.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    server.stop();
  }
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// A checkpoint whose shards are spread over two folders loads with --mirror naming the
// other; a --mirror that is a full copy gives the same output; bad --read-shares are named.
TEST(Mirrors, SpreadCheckpointsAndMirrorFlagsOnTheCommandLine) {
  Copy spread("tiny-a");
  const std::string other = spread.tmp / "other";
  fs::create_directories(other);
  for (const char* shard : {"model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"})
    fs::rename(spread.dir + "/" + shard, other + "/" + shard);
  const std::string args = " --tokens 496,10,20,30 -n 6 --greedy --print-ids";
  auto want = test::run_dsv4("generate -m " + fixture("tiny-a") + args);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  auto missing = test::run_dsv4("generate -m " + spread.dir + args);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(contains(missing.err, "shard model-00002-of-00003.safetensors named in the index does not exist"))
      << missing.err;
  for (const char* ram : {"64G", "min"}) {
    auto r = test::run_dsv4("generate -m " + spread.dir + " --mirror " + other + " --ram " + ram + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want.out) << ram;
  }
  auto inspect = test::run_dsv4("inspect " + spread.dir + " --mirror " + other);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_TRUE(contains(inspect.out, other + "/model-00002-of-00003.safetensors")) << inspect.out;

  auto mirrored = test::run_dsv4("generate -m " + fixture("tiny-a") + " --mirror " + spread.dir + " --mirror " + other +
                                 " --ram min --read-shares 1,1,1" + args);
  EXPECT_EQ(mirrored.exit_code, 0) << mirrored.err;
  EXPECT_EQ(mirrored.out, want.out);
  for (const char* shares : {"1,x", "1,-1", "1"}) {
    auto bad = test::run_dsv4("generate -m " + fixture("tiny-a") + " --mirror " + spread.dir + " --ram min --read-shares " +
                              shares + args);
    EXPECT_EQ(bad.exit_code, 1) << shares;
    EXPECT_TRUE(contains(bad.err, "--read-shares")) << bad.err;
  }
}

}  // namespace
}  // namespace dsv4
