// The RAM budget covers the server's prefix cache: `dsv4 serve` on a streamed synthetic
// checkpoint plans the cache's bound inside --ram, and after enough distinct requests to fill
// (and overflow) the cache, the process's peak RSS is still within the plan's projected peak.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "test_util.h"

extern char** environ;

namespace dsv4 {
namespace {

using test::kAsan;

// One HTTP/1.1 request on a fresh loopback connection; returns the whole response.
std::string http(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                              "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

uint64_t status_kib(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  return 0;
}

TEST(PrefixCacheBudget, ServerPeakRssWithinThePlannedPeak) {
  if (kAsan) GTEST_SKIP() << "ASan's shadow memory and quarantine are not part of any budget";
  test::TempDir tmp;
  const std::string dir = tmp / "synth";
  // ~400 MB of experts, a 512-token vocabulary so the tiny-a tokenizer fits.
  auto synth = test::synth_budget_checkpoint(dir, 512);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(test::fixture("tiny-a") + "/" + f, dir + "/" + f);

  const std::string out = tmp / "serve.out", err = tmp / "serve.err";
  const std::string cmd = std::string("exec ") + DSV4_BINARY + " serve -m " + dir +
                          " --ram 200M --port 0 --threads 2 --ctx 1024 --cache-entries 64 --cache-mb 1 >" + out +
                          " 2>" + err;
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  struct Stop {
    pid_t pid;
    ~Stop() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } stop{pid};

  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {  // loading takes a few seconds on a busy machine
    std::smatch m;
    const std::string text = test::read_file(out);
    if (std::regex_search(text, m, std::regex("listening on http://127.0.0.1:([0-9]+)/"))) port = std::stoi(m[1]);
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(port, 0) << test::read_file(err);
  const std::string plan = test::read_file(err);
  EXPECT_NE(plan.find("(prefix cache 1.0 MiB)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("slots"), std::string::npos) << plan;  // streamed, not resident
  const double projected = test::bytes_after(plan, "projected peak");
  ASSERT_GT(projected, 0) << plan;

  // 8 distinct 600-token prompts: ~0.25 MiB of session state each, twice the cache's bound.
  for (int r = 0; r < 8; ++r) {
    std::string ids;
    for (int i = 0; i < 600; ++i) ids += (i ? "," : "") + std::to_string((i * 37 + r * 101) % 490 + 2);
    const std::string response =
        http(port, "POST", "/v1/completions", R"({"model":"synth","max_tokens":2,"temperature":0,"prompt":[)" + ids + "]}");
    ASSERT_NE(response.find(" 200 "), std::string::npos) << response.substr(0, 400);
  }
  // The cache is full and has evicted: it holds less than the 8 snapshots, within its bound.
  const std::string metrics = http(port, "GET", "/metrics");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(metrics, m, std::regex("dsv4_prefix_cache_bytes ([0-9]+)"))) << metrics;
  EXPECT_GT(std::stod(m[1]), 0.5 * (1 << 20));
  EXPECT_LE(std::stod(m[1]), double(1 << 20));
  ASSERT_TRUE(std::regex_search(metrics, m, std::regex("dsv4_prefix_cache_entries ([0-9]+)"))) << metrics;
  EXPECT_LT(std::stoi(m[1]), 8);
  const double peak = double(status_kib(pid, "VmHWM")) * 1024;
  std::printf("server peak RSS %.1f MiB, projected peak %.1f MiB (--ram 200M, prefix cache 1 MiB)\n", peak / (1 << 20),
              projected / (1 << 20));
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, projected);
}

}  // namespace
}  // namespace dsv4
