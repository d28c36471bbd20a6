// Storage that survives, in the store: the fault layer on both read queues, read faults failing
// only the acquire that needed the expert, mirrors (retry on another copy, read shares, windows
// split over folders), shards truncated, replaced by `mv` or deleted while the engine runs,
// expert scales validated when the bytes arrive (resident and streamed), non-finite activations
// named, inspect --deep. storage_faults_test.cc: faults at each point of a streamed generation,
// in the engine, the CLI and the server, and mirrors on the command line.
#include <gtest/gtest.h>
#include <httplib.h>


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
#include "dsv4/platform/read_queue.h"
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
#include "storage_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using test::fixture;
using namespace storage_test;

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
  std::unique_ptr<ReadQueue> q = backend == IoBackend::kNative ? make_native_read_queue(2, on_done, faults)
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
  ExpertStore store(ck, store_options(IoBackend::kNative, 3));
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
  fs::resize_file(mirror.dir + "/" + shard, 100000);
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
  fs::resize_file(mirror.dir + "/" + shard, 100000);
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
  ExpertStoreOptions o = store_options(IoBackend::kNative);
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
        ExpertStoreOptions o = store_options(IoBackend::kNative);
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
    fs::resize_file(shard, fs::file_size(shard) - 1);
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
  ExpertStore store(ck, store_options(IoBackend::kNative, 2));
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

}  // namespace
}  // namespace dsv4
