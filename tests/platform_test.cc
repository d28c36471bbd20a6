// The platform layer (src/dsv4/platform/) on whichever OS runs the tests: Linux here, Windows
// under wine in scripts/test.sh's Windows stage. UTF-8 paths with Cyrillic and spaces, files
// and their identities, unbuffered reads, the native read queue against plain preads, pages,
// memory facts, processes, and a whole model loaded from a folder with such a name.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

#include "dsv4/model/engine.h"
#include "dsv4/platform/platform.h"
#include "dsv4/platform/read_queue.h"
#include "dsv4/util/error.h"
#include "dsv4/util/file.h"
#include "dsv4/util/io_faults.h"
#include "test_util.h"

namespace dsv4 {
namespace {

std::vector<float> all_logits(Engine& e, const std::vector<int32_t>& tokens) {
  std::vector<float> out(tokens.size() * e.config().vocab_size);
  SessionState s = e.new_session();
  e.forward(s, tokens, out.data(), LogitRows::kAll);
  return out;
}

const std::string kCyrillic = "\xd0\xbc\xd0\xbe\xd0\xb4\xd0\xb5\xd0\xbb\xd1\x8c \xd1\x82\xd0\xb5\xd1\x81\xd1\x82";  // "модель тест"

void write_all(const std::string& path, const std::string& bytes) {
  const int fd = platform::create_for_write(path, false);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  size_t done = 0;
  while (done < bytes.size()) {
    const int64_t n = platform::write(fd, bytes.data() + done, bytes.size() - done);
    ASSERT_GT(n, 0);
    done += static_cast<size_t>(n);
  }
  ASSERT_TRUE(platform::sync_data(fd));
  ASSERT_EQ(platform::close_file(fd), 0);
}

TEST(Platform, Utf8PathsWithSpacesCreateReadRenameRemove) {
  test::TempDir tmp;
  const std::string dir = tmp / kCyrillic;
  ASSERT_TRUE(platform::make_directory(dir));
  ASSERT_TRUE(platform::make_directory(dir));  // already there: still true
  EXPECT_TRUE(is_directory(dir));
  EXPECT_TRUE(platform::can_write_directory(dir));

  const std::string a = dir + "/\xd1\x84\xd0\xb0\xd0\xb9\xd0\xbb a.bin", b = dir + "/b c.bin";
  write_all(a, "first contents");
  write_all(b, "second");
  platform::FileInfo ia, ib;
  ASSERT_TRUE(platform::stat_path(a, &ia));
  ASSERT_TRUE(platform::stat_path(b, &ib));
  EXPECT_TRUE(ia.regular);
  EXPECT_FALSE(ia.directory);
  EXPECT_EQ(ia.size, 14u);
  EXPECT_NE(ia.inode, ib.inode);
  EXPECT_GT(ia.mtime_ns, int64_t{1'600'000'000} * 1'000'000'000);

  // Over an existing file, as the prefix store and the checkpoint writer rename.
  ASSERT_TRUE(platform::rename_replace(a, b));
  EXPECT_FALSE(path_exists(a));
  EXPECT_EQ(read_small_file(b, 1024), "first contents");
  platform::FileInfo moved;
  ASSERT_TRUE(platform::stat_path(b, &moved));
  EXPECT_EQ(moved.inode, ia.inode);  // the same file under the new name
  EXPECT_EQ(moved.device, ia.device);

  // std::filesystem sees the same names.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(platform::fs_path(dir)))
    names.push_back(platform::utf8_path(e.path().filename()));
  EXPECT_EQ(names, std::vector<std::string>{"b c.bin"});

  std::FILE* f = platform::fopen_utf8(dir + "/\xd0\xb6.txt", "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("x\n", f);
  std::fclose(f);
  EXPECT_EQ(read_small_file(dir + "/\xd0\xb6.txt", 16), "x\n");  // binary: no \r added

  EXPECT_TRUE(platform::remove_file(b));
  EXPECT_FALSE(platform::remove_file(b));
  EXPECT_EQ(errno, ENOENT);
  EXPECT_LT(platform::open_read(b), 0);
  EXPECT_EQ(errno, ENOENT);
  try {
    File::open_read(b);
    FAIL() << "opening a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(b + ": cannot open"), std::string::npos) << e.what();
  }
  // Exclusive creation refuses an existing file.
  write_all(b, "again");
  EXPECT_LT(platform::create_for_write(b, true), 0);
  EXPECT_EQ(errno, EEXIST);
}

TEST(Platform, PreadAndUnbufferedReadsSeeTheSameBytes) {
  test::TempDir tmp;
  const std::string path = tmp / (kCyrillic + ".bin");
  std::string bytes(3 * platform::kDirectAlign + 100, '\0');
  std::mt19937 rng(7);
  for (char& c : bytes) c = static_cast<char>(rng());
  write_all(path, bytes);

  File buffered = File::open_read(path);
  EXPECT_EQ(buffered.size(), bytes.size());
  std::string got(200, '\0');
  buffered.read_exact(got.data(), 200, 4000);
  EXPECT_EQ(got, bytes.substr(4000, 200));
  char c;
  EXPECT_EQ(platform::pread(buffered.fd(), &c, 1, bytes.size()), 0);  // at the end

  File direct = File::open_direct(path);
  if (direct.valid()) {
    // Aligned buffer, offset and length; the last block is short (the end of the file).
    AlignedBuffer buf(4 * platform::kDirectAlign);
    const int64_t n = platform::pread(direct.fd(), buf.data(), 4 * platform::kDirectAlign, 0);
    ASSERT_EQ(n, static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(std::memcmp(buf.data(), bytes.data(), bytes.size()), 0);
    // The windowed reader at an unaligned offset.
    std::string window(5000, '\0');
    ASSERT_TRUE(read_direct_window(direct, window.data(), 5000, 3, buf.data(), buf.size()));
    EXPECT_EQ(window, bytes.substr(3, 5000));
  }
}

// The OS's own queue (io_uring, IOCP) and the pread threads deliver the same bytes as a pread,
// through unbuffered and buffered descriptors, with reads split in several ops per job.
TEST(Platform, NativeReadQueueAndThreadsDeliverTheFileBytes) {
  test::TempDir tmp;
  const std::string path = tmp / (kCyrillic + " queue.bin");
  std::string bytes(64 * platform::kDirectAlign, '\0');
  std::mt19937 rng(11);
  for (char& c : bytes) c = static_cast<char>(rng());
  write_all(path, bytes);
  File buffered = File::open_read(path);
  File direct = File::open_direct(path);
  const int read_fd = direct.valid() ? direct.fd() : buffered.fd();

  for (bool native : {true, false}) {
    std::mutex m;
    std::condition_variable cv;
    int finished = 0;
    std::vector<std::string> errors;
    auto done = [&](uint64_t, const ReadOutcome& o) {
      std::lock_guard<std::mutex> lock(m);
      if (!o.error.empty()) errors.push_back(o.error);
      ++finished;
      cv.notify_all();
    };
    std::unique_ptr<ReadQueue> q = native ? make_native_read_queue(4, done) : make_thread_read_queue(2, done);
    if (!q) {
      EXPECT_STREQ(platform::native_read_queue_name(), "") << "the native queue must exist where it is named";
      continue;
    }
    AlignedBuffer out(bytes.size());
    constexpr int kJobs = 8;
    const uint64_t per_job = bytes.size() / kJobs;
    for (int j = 0; j < kJobs; ++j) {
      std::vector<ReadOp> ops;
      for (int k = 0; k < 2; ++k) {  // two halves per job: ops of one job complete together
        ReadOp op;
        op.fd = read_fd;
        op.buffered_fd = buffered.fd();
        op.path = &buffered.path();
        op.offset = j * per_job + k * per_job / 2;
        op.length = op.needed = per_job / 2;
        op.dst = out.data() + op.offset;
        ops.push_back(op);
      }
      q->submit(static_cast<uint64_t>(j), std::move(ops));
    }
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return finished == kJobs; });
    lock.unlock();
    q->stop();
    EXPECT_TRUE(errors.empty()) << errors.front();
    EXPECT_EQ(std::memcmp(out.data(), bytes.data(), bytes.size()), 0) << q->name();
  }
}

// A vectored op (one request, several destinations) lands each part of the range in its own
// place, also when reads come back short (the fault layer halves them) and resume in the
// middle of a span; every queue takes it as one request when nothing is short.
TEST(Platform, VectoredReadsLandInEverySpan) {
  test::TempDir tmp;
  const std::string path = tmp / (kCyrillic + " spans.bin");
  std::string bytes(48 * platform::kDirectAlign, '\0');
  std::mt19937 rng(12);
  for (char& c : bytes) c = static_cast<char>(rng());
  write_all(path, bytes);
  File buffered = File::open_read(path);
  File direct = File::open_direct(path);
  const int read_fd = direct.valid() ? direct.fd() : buffered.fd();
  constexpr uint64_t P = platform::kDirectAlign;
  // Spans of 8, 3, 12 and 1 pages of the file, placed in memory in another order.
  const uint64_t pages[4] = {8, 3, 12, 1}, place[4] = {20, 0, 4, 16};

  for (bool native : {true, false}) {
    for (bool short_reads : {false, true}) {
      auto faults = short_reads ? std::make_shared<IoFaults>(IoFaults::parse_rules("short:count=5", "test"))
                                : std::shared_ptr<IoFaults>();
      std::mutex m;
      std::condition_variable cv;
      bool finished = false;
      ReadOutcome outcome;
      auto done = [&](uint64_t, const ReadOutcome& o) {
        std::lock_guard<std::mutex> lock(m);
        outcome = o;
        finished = true;
        cv.notify_all();
      };
      std::unique_ptr<ReadQueue> q =
          native ? make_native_read_queue(4, done, faults) : make_thread_read_queue(2, done, faults);
      if (!q) continue;
      AlignedBuffer out(32 * P);
      std::memset(out.data(), 0, out.size());
      ReadOp op;
      op.fd = read_fd;
      op.buffered_fd = buffered.fd();
      op.path = &buffered.path();
      op.offset = 5 * P;
      for (int i = 0; i < 4; ++i) {
        op.spans.push_back({out.data() + place[i] * P, pages[i] * P});
        op.length += pages[i] * P;
      }
      op.needed = op.length;
      q->submit(1, {op});
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return finished; });
      lock.unlock();
      q->stop();
      const std::string what = std::string(q->name()) + (short_reads ? ", short reads" : "");
      ASSERT_TRUE(outcome.error.empty()) << outcome.error << " " << what;
      uint64_t at = op.offset;
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(std::memcmp(out.data() + place[i] * P, bytes.data() + at, pages[i] * P), 0) << "span " << i << " " << what;
        at += pages[i] * P;
      }
      if (short_reads) {
        EXPECT_GT(outcome.requests, 1u) << what;
      } else if (std::string(q->name()) != "IOCP") {
        EXPECT_EQ(outcome.requests, 1u) << what;
      }
    }
  }
}

TEST(Platform, PagesMemoryAndProcessFacts) {
  for (size_t bytes : {size_t{4096}, size_t{3} << 20, (size_t{5} << 20) + 123}) {
    uint8_t* p = platform::allocate_pages(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % platform::kDirectAlign, 0u);
    for (size_t i = 0; i < bytes; i += 4096) EXPECT_EQ(p[i], 0) << i;
    std::memset(p, 1, bytes);
    platform::free_pages(p, bytes);
  }
  void* small = platform::aligned_alloc(64, 100);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  platform::aligned_free(small);

  EXPECT_GT(platform::total_memory_bytes(), uint64_t{256} << 20);
  EXPECT_GT(platform::available_memory_bytes(), 0u);
  EXPECT_GT(platform::current_rss_bytes(), 0u);
  EXPECT_GE(platform::peak_rss_bytes(), platform::current_rss_bytes() / 2);
  EXPECT_GE(platform::cpu_count(), 1);

  EXPECT_TRUE(platform::process_alive(platform::process_id()));
  EXPECT_FALSE(platform::process_alive(0));
  const std::string exe = platform::executable_path();
  EXPECT_TRUE(path_exists(exe)) << exe;
  EXPECT_GT(std::string(platform::os_name()).size(), 0u);
}

// A checkpoint in a folder named in Cyrillic, with spaces, loads and gives the same logits as
// the fixture where it lies.
TEST(Platform, ModelFolderNamedInCyrillicWithSpacesGivesTheSameLogits) {
  test::TempDir tmp;
  const std::string dir = tmp / (kCyrillic + " tiny a");
  test::copy_dir(test::fixture("tiny-a"), dir);
  auto here = test::open_engine(test::fixture("tiny-a"), EngineOptions{});
  auto there = test::open_engine(dir, EngineOptions{});
  const std::vector<int32_t> tokens = {0, 5, 17, 3};
  const std::vector<float> a = all_logits(*here, tokens);
  const std::vector<float> b = all_logits(*there, tokens);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace dsv4
