// Sessions as bytes (model/session_io) and the prefix cache's disk tier (server/prefix_store):
// a session saved mid-sequence and read back equals the original in every field and continues
// with bit-identical logits; corrupted, truncated and foreign entries are detected and never
// used; a writer killed with SIGKILL leaves no entry behind that fails to load.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <thread>
#include <type_traits>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "dsv4/model/engine.h"
#include "dsv4/model/session_io.h"
#include "dsv4/server/prefix_cache.h"
#include "dsv4/server/prefix_store.h"
#include "dsv4/util/error.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class StringSink : public ByteSink {
 public:
  void write(const void* data, size_t n) override { bytes.append(static_cast<const char*>(data), n); }
  std::string bytes;
};

class StringSource : public ByteSource {
 public:
  explicit StringSource(std::string_view b) : bytes_(b) {}
  void read(void* data, size_t n) override {
    if (n > remaining()) fail("truncated");
    std::memcpy(data, bytes_.data() + at_, n);
    at_ += n;
  }
  uint64_t remaining() const override { return bytes_.size() - at_; }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

std::unique_ptr<Engine> tiny_engine() {
  EngineOptions o;
  o.numerics = kernels::Numerics::kReference;
  o.threads = 1;
  return test::open_engine(test::fixture("tiny-a"), o);
}

std::vector<int32_t> prompt_of(size_t n) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(3 + (i * 37) % 400));
  return p;
}

// Every field of tiny-a's session is exercised after 37 tokens (window 10, compression ratios
// 4 and 8, not multiples of either): if a field is added to SessionState but not to
// visit_fields, the restored session differs (operator== compares every field) and the test
// fails. A new field must hold a non-default value at this point for the check to bite.
TEST(SessionIo, RoundTripMidSequenceIsEqualAndContinuesBitIdentically) {
  auto engine = tiny_engine();
  const int64_t V = engine->config().vocab_size;
  SessionState s = engine->new_session();
  std::vector<float> logits(static_cast<size_t>(V));
  engine->forward(s, prompt_of(37), logits.data(), LogitRows::kLast);
  bool pending = false, previous = false, entries = false;
  for (const LayerState& l : s.layers)
    for (const CompressorState* c : {&l.compressor, &l.indexer}) {
      pending |= !c->pending_kv.empty() && !c->pending_gate.empty();
      previous |= c->has_previous && !c->previous_kv.empty() && !c->previous_gate.empty();
      entries |= c->n_entries > 0 && !c->entries.empty();
    }
  ASSERT_TRUE(pending && previous && entries) << "the session does not exercise every compressor field";
  ASSERT_FALSE(s.layers[0].window_kv.empty());

  StringSink sink;
  write_session(s, sink);
  EXPECT_EQ(sink.bytes.size(), serialized_session_bytes(s));
  StringSource source(sink.bytes);
  SessionState restored = read_session(source);
  EXPECT_EQ(source.remaining(), 0u);
  ASSERT_TRUE(restored == s);

  // The next token's logits: the uninterrupted session and the restored one agree bit for bit.
  const std::vector<int32_t> next = {57, 58, 59};
  std::vector<float> a(next.size() * static_cast<size_t>(V)), b(a.size());
  engine->forward(s, next, a.data(), LogitRows::kAll);
  engine->forward(restored, next, b.data(), LogitRows::kAll);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_TRUE(restored == s);
}

// Changes field k of a session, in visit_fields' order (element 0 of a vector: a held row of
// the MTP stream ring); `count` ends as the number of fields.
struct ChangeOneField {
  size_t k;
  size_t count = 0;
  template <typename T>
  void operator()(T& field) {
    if constexpr (std::is_same_v<T, std::vector<LayerState>>) {
      for (LayerState& l : field) visit_fields(l, *this);
    } else if (count++ == k) {
      if constexpr (std::is_same_v<T, bool>) {
        field = !field;
      } else if constexpr (std::is_arithmetic_v<T>) {
        field += 1;
      } else if (field.empty()) {
        field.push_back(1);
      } else {
        field[0] = field[0] == 0 ? 1 : 0;
      }
    }
  }
};

// test::expect_same_session compares every field: a copy of a session (tiny-a with the MTP
// drafter, 37 tokens) with any one field changed fails it.
TEST(SessionIo, ExpectSameSessionFailsWhenAnyOneFieldDiffers) {
  EngineOptions o;
  o.numerics = kernels::Numerics::kReference;
  o.threads = 1;
  o.mtp = true;
  auto engine = test::open_engine(test::fixture("tiny-a"), o);
  ASSERT_TRUE(engine->has_mtp());
  SessionState s = engine->new_session();
  engine->forward(s, prompt_of(37), nullptr, LogitRows::kLast);
  ASSERT_FALSE(s.mtp.stream_position.empty());
  ASSERT_TRUE(s.mtp.stream_position[0] >= 0 && s.mtp.stream_position[0] < s.position) << "the MTP stream ring's row 0 is not held";
  test::expect_same_session(s, SessionState(s));
  size_t fields = 0;
  for (size_t k = 0; k == 0 || k < fields; ++k) {
    SessionState changed = s;
    ChangeOneField change{k};
    visit_fields(changed, change);
    fields = change.count;
    ::testing::TestPartResultArray failures;
    {
      ::testing::ScopedFakeTestPartResultReporter intercept(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
      test::expect_same_session(s, changed);
    }
    EXPECT_GT(failures.size(), 0) << "field " << k << " of " << fields << " differs, yet expect_same_session passed";
  }
  EXPECT_EQ(fields, 2 + 15 * s.layers.size() + 3);
}

TEST(SessionIo, TruncatedOrGarbledBytesThrowWithoutHugeAllocations) {
  auto engine = tiny_engine();
  SessionState s = engine->new_session();
  engine->forward(s, prompt_of(13), nullptr, LogitRows::kLast);
  StringSink sink;
  write_session(s, sink);
  for (size_t cut : {size_t{0}, size_t{7}, sink.bytes.size() / 2, sink.bytes.size() - 1}) {
    StringSource source(std::string_view(sink.bytes).substr(0, cut));
    EXPECT_THROW(read_session(source), Error) << cut;
  }
  std::string garbled = sink.bytes;
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(garbled.data() + 8, &huge, 8);  // the token count
  StringSource source(garbled);
  EXPECT_THROW(read_session(source), Error);
}

// ---- the disk tier ----------------------------------------------------------------------------

using server::PrefixCache;
using server::PrefixStore;
using server::StoreIdentity;
using server::StoreLimits;

SessionState synthetic_session(std::vector<int32_t> tokens, size_t floats, float value) {
  SessionState s;
  s.tokens = std::move(tokens);
  s.position = static_cast<int64_t>(s.tokens.size());
  s.layers.resize(2);
  s.layers[0].window_kv.assign(floats, value);
  s.layers[1].compressor.entries.assign(floats / 2, -value);
  s.layers[1].compressor.n_entries = 3;
  s.layers[1].indexer.has_previous = true;
  return s;
}

const StoreIdentity kIdentity = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const StoreLimits kLimits{2, 1000};

struct Warnings {
  std::vector<std::string> lines;
  PrefixStore::Warn sink() {
    return [this](const std::string& m) { lines.push_back(m); };
  }
};

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Stores `s` as the only entry of a new store at `cache` (text "abc") and closes the store;
// returns the entry's file name.
std::string store_alone(const std::string& cache, Warnings& w, const SessionState& s) {
  PrefixStore store(cache, 1 << 20, kIdentity, kLimits, w.sink());
  return store.store(s, {}, "abc").file;
}

TEST(PrefixStore, EntriesSurviveReopeningAndLoadExactly) {
  test::TempDir dir;
  Warnings w;
  const SessionState a = synthetic_session({1, 2, 3}, 100, 0.5f), b = synthetic_session({1, 2, 3, 4, 5}, 64, 2.0f);
  {
    PrefixStore store(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink());
    EXPECT_TRUE(store.entries().empty());
    EXPECT_FALSE(store.store(a, std::vector<int32_t>{9}, "abc9").file.empty());
    std::this_thread::sleep_for(10ms);  // distinct mtimes
    EXPECT_FALSE(store.store(b, {}, "abcde").file.empty());
    EXPECT_EQ(store.store(b, {}, "abcde").removed.size(), 0u);  // the same key: only marked used
    EXPECT_EQ(store.entries().size(), 2u);
  }
  PrefixStore store(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink());
  ASSERT_EQ(store.entries().size(), 2u);
  EXPECT_EQ(store.entries()[0].key, (std::vector<int32_t>{1, 2, 3, 4, 5}));  // most recent first
  EXPECT_EQ(store.entries()[1].key, (std::vector<int32_t>{1, 2, 3, 9}));
  EXPECT_EQ(store.entries()[1].state_tokens, 3u);
  EXPECT_EQ(store.entries()[1].text, "abc9");
  auto loaded = store.load(1);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(*loaded == a);
  EXPECT_EQ(store.entries()[0].key, (std::vector<int32_t>{1, 2, 3, 9}));  // used: now first
  EXPECT_TRUE(w.lines.empty());
  for (const std::string& f : files_in(dir / "cache")) EXPECT_TRUE(f.ends_with(".dsv4p")) << f;
}

TEST(PrefixStore, AFlippedByteAnywhereIsDetectedOnceAndTheEntryRemoved) {
  test::TempDir dir;
  Warnings w;
  const SessionState a = synthetic_session({1, 2, 3}, 100, 0.5f);
  const std::string file = store_alone(dir / "cache", w, a);
  const std::string path = dir / "cache/" + file;
  const std::string original = test::read_file(path);
  // Flip one bit at positions across the header's checksummed part, the key, text and session.
  for (size_t at : {size_t{20}, size_t{64}, size_t{70}, original.size() / 2, original.size() - 1}) {
    std::string bytes = original;
    bytes[at] ^= 0x10;
    test::write_file(path, bytes);
    Warnings flip;
    PrefixStore store(dir / "cache", 1 << 20, kIdentity, kLimits, flip.sink());
    std::optional<SessionState> loaded;
    for (size_t i = 0; i < store.entries().size() && !loaded; ++i) loaded = store.load(i);
    EXPECT_FALSE(loaded) << "flip at " << at;
    ASSERT_EQ(flip.lines.size(), 1u) << "flip at " << at;
    EXPECT_TRUE(store.entries().empty());
    EXPECT_FALSE(fs::exists(path)) << "a corrupted entry is removed";
  }
  // Truncated: found at start.
  test::write_file(path, original.substr(0, original.size() - 10));
  Warnings cut;
  PrefixStore store(dir / "cache", 1 << 20, kIdentity, kLimits, cut.sink());
  EXPECT_TRUE(store.entries().empty());
  ASSERT_EQ(cut.lines.size(), 1u);
  EXPECT_NE(cut.lines[0].find("truncated"), std::string::npos) << cut.lines[0];
  EXPECT_FALSE(fs::exists(path));
}

TEST(PrefixStore, ForeignEntriesAreLeftAloneAndStaleTempFilesRemoved) {
  test::TempDir dir;
  Warnings w;
  StoreIdentity other = kIdentity;
  other[0] ^= 1;
  {
    PrefixStore store(dir / "cache", 1 << 20, other, kLimits, w.sink());
    store.store(synthetic_session({1, 2}, 10, 1.0f), {}, "");
  }
  // A temporary file of a process that is gone, and one of a live process (this one).
  pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  test::write_file(dir / ("cache/tmp-" + std::to_string(child) + "-0.partial"), "half an entry");
  test::write_file(dir / ("cache/tmp-" + std::to_string(getpid()) + "-0.partial"), "being written");
  test::write_file(dir / "cache/README", "not ours");
  PrefixStore store(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink());
  EXPECT_TRUE(store.entries().empty());
  ASSERT_EQ(w.lines.size(), 1u);
  EXPECT_NE(w.lines[0].find("1 entry of another checkpoint"), std::string::npos) << w.lines[0];
  const std::vector<std::string> files = files_in(dir / "cache");
  EXPECT_EQ(files.size(), 3u);  // the foreign entry, the live temp file, README
  EXPECT_EQ(std::count(files.begin(), files.end(), "tmp-" + std::to_string(child) + "-0.partial"), 0);
  // A session that does not fit the model (wrong layer count) is refused on load.
  PrefixStore strict(dir / "cache2", 1 << 20, kIdentity, StoreLimits{3, 1000}, w.sink());
  strict.store(synthetic_session({1, 2}, 10, 1.0f), {}, "");
  EXPECT_FALSE(strict.load(0));
}

// A FIFO (no writer: a blocking open would wait forever) and a device among the entries, named
// as entries of this identity: the store opens within seconds, says once per path that it is
// not a regular file and ignored (left in place), and still loads the valid entry.
TEST(PrefixStore, AFifoOrADeviceAmongTheEntriesCannotHangTheStart) {
  test::TempDir dir;
  Warnings w;
  const SessionState a = synthetic_session({1, 2, 3}, 100, 0.5f);
  const std::string file = store_alone(dir / "cache", w, a);
  const std::string identity = file.substr(0, file.find('-') + 1);
  const std::string fifo = dir / ("cache/" + identity + "00000000000000000000000000000000.dsv4p");
  const std::string device = dir / ("cache/" + identity + "11111111111111111111111111111111.dsv4p");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  fs::create_symlink("/dev/zero", device);
  Warnings start;
  auto opened = std::async(std::launch::async, [&] {
    return std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, start.sink());
  });
  if (opened.wait_for(5s) != std::future_status::ready) {
    // Unblock the hung open (a writer appears, then goes), so the test fails instead of hanging.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    opened.wait();
    FAIL() << "opening the store blocked on the FIFO";
  }
  std::unique_ptr<PrefixStore> store = opened.get();
  ASSERT_EQ(start.lines.size(), 2u) << ::testing::PrintToString(start.lines);
  for (const std::string& path : {fifo, device}) {
    const std::string line = "--cache-dir: " + path + " is not a regular file; ignored";
    EXPECT_EQ(std::count(start.lines.begin(), start.lines.end(), line), 1) << ::testing::PrintToString(start.lines);
  }
  ASSERT_EQ(store->entries().size(), 1u);
  auto loaded = store->load(0);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(*loaded == a);
  EXPECT_TRUE(fs::exists(fs::symlink_status(fifo)));
  EXPECT_TRUE(fs::exists(fs::symlink_status(device)));
}

TEST(PrefixStore, BoundedInBytesOldestFirst) {
  test::TempDir dir;
  Warnings w;
  std::vector<std::string> files;
  uint64_t one = 0;
  {
    PrefixStore probe(dir / "probe", 1 << 20, kIdentity, kLimits, w.sink());
    probe.store(synthetic_session({1}, 1000, 1.0f), {}, "");
    one = probe.bytes();
  }
  PrefixStore store(dir / "cache", 3 * one + one / 2, kIdentity, kLimits, w.sink());
  for (int32_t i = 0; i < 3; ++i) files.push_back(store.store(synthetic_session({i}, 1000, 1.0f), {}, "").file);
  ASSERT_TRUE(store.load(2));  // the oldest, used now
  const auto stored = store.store(synthetic_session({7}, 1000, 1.0f), {}, "");
  ASSERT_EQ(stored.removed.size(), 1u);
  EXPECT_EQ(stored.removed[0], files[1]);  // the least recently used
  EXPECT_LE(store.bytes(), 3 * one + one / 2);
  EXPECT_EQ(files_in(dir / "cache").size(), 3u);
  // A smaller bound at start evicts down to it.
  PrefixStore smaller(dir / "cache", one, kIdentity, kLimits, w.sink());
  EXPECT_EQ(smaller.entries().size(), 1u);
  EXPECT_EQ(smaller.entries()[0].key, std::vector<int32_t>{7});
}

// SIGKILL in the middle of writes: whatever is left under a real name loads and verifies.
TEST(PrefixStore, AWriterKilledMidWriteLeavesNoPartialEntry) {
  test::TempDir dir;
  const std::string cache = dir / "cache";
  { PrefixStore create(cache, uint64_t{1} << 30, kIdentity, kLimits, {}); }
  for (int round = 0; round < 3; ++round) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      PrefixStore store(cache, uint64_t{1} << 30, kIdentity, kLimits, [](const std::string&) {});
      for (int32_t i = 0;; ++i) store.store(synthetic_session({round, i}, 1 << 20, 1.0f), {}, "");  // ~6 MB each
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 70 * round));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  Warnings w;
  PrefixStore store(cache, uint64_t{1} << 30, kIdentity, kLimits, w.sink());
  EXPECT_TRUE(w.lines.empty()) << w.lines.front();
  ASSERT_GE(store.entries().size(), 1u) << "the writers wrote nothing in time";
  for (const std::string& f : files_in(cache)) EXPECT_TRUE(f.ends_with(".dsv4p")) << "left behind: " << f;
  // Each load moves the entry to the front: n loads of the last one visit every entry once.
  const size_t n = store.entries().size();
  for (size_t k = 0; k < n; ++k) ASSERT_TRUE(store.load(n - 1)) << store.entries()[n - 1].file;
  EXPECT_TRUE(w.lines.empty());
}

TEST(PrefixCache, TheDiskTierServesAfterARestart) {
  test::TempDir dir;
  Warnings w;
  const SessionState a = synthetic_session({1, 2, 3}, 100, 0.5f);
  {
    PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
    cache.insert(a, std::vector<int32_t>{4}, "abcd");
    EXPECT_EQ(cache.store()->entries().size(), 0u);  // written by persist()
    cache.persist();
    EXPECT_EQ(cache.store()->entries().size(), 1u);
  }
  PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
  EXPECT_EQ(cache.entries(), 0u);  // nothing in RAM yet
  auto m = cache.longest_token_prefix(std::vector<int32_t>{1, 2, 3, 4, 5});
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->state == a);
  EXPECT_EQ(m->key, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(cache.entries(), 1u);  // now held in RAM too
  auto t = cache.longest_text_prefix("abcdef", [](std::string_view) { return true; });
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->state == a);
  // A RAM-only cache (no store) and a store-only one (no RAM entries) both work.
  PrefixCache disk_only(0, 0, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
  EXPECT_TRUE(disk_only.longest_token_prefix(std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(disk_only.entries(), 0u);
  EXPECT_TRUE(w.lines.empty());
}

TEST(PrefixCache, TheRamBoundHoldsWithADiskTierToo) {
  test::TempDir dir;
  Warnings w;
  const SessionState a = synthetic_session({1, 2}, 100, 0.5f), b = synthetic_session({5, 6}, 100, 1.5f);
  PrefixCache cache(1, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
  cache.insert(a, {}, "");
  cache.insert(b, {}, "");  // a leaves RAM before persist(): it is written first
  EXPECT_EQ(cache.entries(), 1u);
  EXPECT_EQ(cache.store()->entries().size(), 1u);
  cache.persist();
  EXPECT_EQ(cache.store()->entries().size(), 2u);
  auto m = cache.longest_token_prefix(std::vector<int32_t>{1, 2, 3});
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->state == a);
  EXPECT_EQ(cache.entries(), 1u);
  // Bigger than the RAM bound: straight to disk, never held.
  PrefixCache tiny(4, 10, std::make_unique<PrefixStore>(dir / "tiny", 1 << 20, kIdentity, kLimits, w.sink()));
  tiny.insert(a, {}, "");
  EXPECT_EQ(tiny.entries(), 0u);
  EXPECT_EQ(tiny.bytes(), 0u);
  EXPECT_EQ(tiny.store()->entries().size(), 1u);
  m = tiny.longest_token_prefix(std::vector<int32_t>{1, 2, 3});
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->state == a);
  EXPECT_EQ(tiny.bytes(), 0u);
  EXPECT_TRUE(w.lines.empty());
}


// A session of `tokens` tokens whose compressed caches hold `rows` rows, the same rows in
// every session that has them (as a prefill's are), and a window of its own.
SessionState chained_session(size_t tokens, int64_t rows) {
  SessionState s;
  for (size_t i = 0; i < tokens; ++i) s.tokens.push_back(static_cast<int32_t>(1 + i % 50));
  s.position = static_cast<int64_t>(tokens);
  s.layers.resize(2);
  s.layers[0].window_kv.assign(64, static_cast<float>(tokens));
  for (int64_t r = 0; r < rows; ++r)
    for (int k = 0; k < 8; ++k) s.layers[1].compressor.entries.push_back(static_cast<float>(r * 8 + k));
  s.layers[1].compressor.n_entries = rows;
  for (int64_t r = 0; r < rows / 2; ++r)
    for (int k = 0; k < 4; ++k) s.layers[1].indexer.entries.push_back(-static_cast<float>(r * 4 + k));
  s.layers[1].indexer.n_entries = rows / 2;
  return s;
}

// The disk tier is deduplicated by block: a request's snapshot below two block snapshots is
// written as the rows past the deeper one, each block as the rows past the one above it; after
// a restart the chain is rebuilt into exactly the original sessions, a parent is never
// evicted before its children, and a corrupted block costs the snapshots below it (one warning
// each), never a wrong session.
TEST(PrefixCache, TheDiskTierSharesBlocksAndRebuildsChainsAfterARestart) {
  test::TempDir dir;
  Warnings w;
  const SessionState b1 = chained_session(8, 2), b2 = chained_session(16, 4), own = chained_session(20, 5);
  std::vector<int32_t> prompt = own.tokens;
  prompt.insert(prompt.end(), {7, 7, 7});
  {
    PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
    cache.insert_block(b1);
    cache.insert_block(b2);
    cache.insert(own, {}, "");
    cache.persist();
    const auto& stored = cache.store()->entries();
    ASSERT_EQ(stored.size(), 3u);
    std::map<size_t, server::StoredPrefix> by_tokens;
    for (const server::StoredPrefix& s : stored) by_tokens[s.state_tokens] = s;
    EXPECT_TRUE(by_tokens[8].parent_file.empty() && by_tokens[8].block && !by_tokens[8].own);
    EXPECT_EQ(by_tokens[16].parent_file, by_tokens[8].file);
    EXPECT_EQ(by_tokens[20].parent_file, by_tokens[16].file);
    EXPECT_TRUE(by_tokens[20].own && !by_tokens[20].block);
    EXPECT_EQ(by_tokens[8].children, 1u);
    // Whole, the request's snapshot would hold all five rows and both indexer rows: its file
    // holds the one compressor row past the deeper block's four.
    PrefixStore whole(dir / "whole", 1 << 20, kIdentity, kLimits, w.sink());
    whole.store(own, {}, "");
    EXPECT_EQ(whole.bytes() - by_tokens[20].bytes, (4u * 8 + 2u * 4) * sizeof(float));
  }
  {
    PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
    auto m = cache.longest_token_prefix(prompt);
    ASSERT_TRUE(m);
    EXPECT_TRUE(m->state == own);
    EXPECT_EQ(cache.entries(), 1u);  // the request's snapshot, held in RAM with its blocks
    EXPECT_GT(cache.bytes(), 0u);
    // A prompt that parts from it after 17 tokens: the deeper block, rebuilt.
    std::vector<int32_t> other(prompt.begin(), prompt.begin() + 17);
    other.push_back(99);
    other.push_back(99);
    m = cache.longest_token_prefix(other);
    ASSERT_TRUE(m);
    EXPECT_TRUE(m->state == b2);
  }
  EXPECT_TRUE(w.lines.empty()) << w.lines.front();
  {
    // Bounded below its three entries: the leaf goes first, and its parents stay linked.
    PrefixStore store(dir / "cache", PrefixStore(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()).bytes() - 1,
                      kIdentity, kLimits, w.sink());
    ASSERT_EQ(store.entries().size(), 2u);
    for (const server::StoredPrefix& s : store.entries()) EXPECT_TRUE(s.block) << s.state_tokens;
  }
  // Restore the leaf, then corrupt the middle block.
  {
    PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
    cache.insert_block(b1);
    cache.insert_block(b2);
    cache.insert(own, {}, "");
    cache.persist();
    ASSERT_EQ(cache.store()->entries().size(), 3u);
  }
  std::string middle;
  {
    PrefixStore store(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink());
    for (const server::StoredPrefix& s : store.entries())
      if (s.state_tokens == 16) middle = dir / ("cache/" + s.file);
  }
  ASSERT_FALSE(middle.empty());
  std::string bytes = test::read_file(middle);
  bytes[bytes.size() / 2] ^= 0x10;
  test::write_file(middle, bytes);
  Warnings bad;
  PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, bad.sink()));
  auto m = cache.longest_token_prefix(prompt);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->state == b1);  // the deepest snapshot whose chain is sound
  ASSERT_EQ(bad.lines.size(), 2u);
  EXPECT_NE(bad.lines[0].find("checksum mismatch"), std::string::npos) << bad.lines[0];
  EXPECT_NE(bad.lines[1].find("its block snapshot could not be read"), std::string::npos) << bad.lines[1];
  EXPECT_EQ(cache.store()->entries().size(), 1u);
}

// A request's snapshot whose key (its tokens + an unfed tail) equals a stored block snapshot's
// (tokens only) is another session of the same key: the stored one stays, and a lookup gets
// it whole and consistent, never one session's state under the other's token count.
TEST(PrefixCache, ASnapshotWithTheKeyOfAStoredBlockLeavesTheBlockAsItIs) {
  test::TempDir dir;
  Warnings w;
  const SessionState block = chained_session(16, 4), own = chained_session(15, 3);
  {
    PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
    cache.insert_block(block);
    cache.persist();
  }
  PrefixCache cache(4, 1 << 20, std::make_unique<PrefixStore>(dir / "cache", 1 << 20, kIdentity, kLimits, w.sink()));
  cache.insert(own, std::vector<int32_t>{block.tokens.back()}, "");  // key: block.tokens
  std::vector<int32_t> prompt = block.tokens;
  prompt.push_back(3);
  auto m = cache.longest_token_prefix(prompt);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->state == block);
  EXPECT_TRUE(w.lines.empty()) << w.lines.front();
}

}  // namespace
}  // namespace dsv4
