// An in-process dsv4 server on the tiny-a fixture for tests: a free loopback port, stopped
// (and its threads joined) even when a test fails; plain HTTP helpers and a bare TCP client
// for what an HTTP library would not send.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "dsv4/model/engine.h"
#include "dsv4/server/http_server.h"
#include "dsv4/text/tokenizer.h"
#include "test_util.h"

namespace dsv4::server::test_server {

using namespace std::chrono_literals;
using test::fixture;

struct Model {
  std::unique_ptr<Engine> engine;
  text::Tokenizer tokenizer;
};

// Loaded once per test process (ctest runs each test in its own process).
inline Model& model() {
  static Model m = [] {
    EngineOptions eo;
    eo.numerics = kernels::Numerics::kReference;  // the reference.json greedy tokens
    eo.threads = 1;
    return Model{test::open_engine(fixture("tiny-a"), eo), text::Tokenizer::from_file(fixture("tiny-a") + "/tokenizer.json")};
  }();
  return m;
}

inline ServerOptions test_options() {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.model_name = "tiny-a";
  o.max_body_bytes = 1 << 20;
  o.defaults.max_tokens = 8;
  o.defaults.vocab_size = static_cast<int32_t>(model().engine->config().vocab_size);
  o.scheduler.max_queue = 2;
  return o;
}

// A server on a free loopback port, stopped (and its threads joined) even when a test fails.
class TestServer {
 public:
  explicit TestServer(ServerOptions o = test_options()) : TestServer(*model().engine, std::move(o)) {}
  // On another engine of tiny-a (other numerics, a RAM budget).
  TestServer(Engine& engine, ServerOptions o) : server_(engine, model().tokenizer, std::move(o)) {
    // As `dsv4 serve` does. Debian's cpp-httplib 0.11 is a shared library that writes with
    // flags 0, so a client write to a closed socket would end the test binary, not fail one check.
    signal(SIGPIPE, SIG_IGN);
    port_ = server_.bind();
    server_.start();
  }
  ~TestServer() { server_.stop(); }
  int port() const { return port_; }
  Server& server() { return server_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120);
    return c;
  }

 private:
  Server server_;
  int port_ = 0;
};

struct Reply {
  int status = 0;
  Json json;
  std::string body;
  httplib::Headers headers;
};

// An empty Reply (status 0) when the request got no answer.
inline Reply reply_of(const httplib::Result& res) {
  Reply r;
  if (!res) return r;
  r.status = res->status;
  r.body = res->body;
  r.headers = res->headers;
  r.json = Json::parse(res->body, nullptr, false);
  return r;
}

inline Reply post(const TestServer& s, const std::string& path, const std::string& body,
           const std::string& content_type = "application/json", httplib::Headers headers = {}) {
  return reply_of(s.client().Post(path.c_str(), headers, body, content_type.c_str()));
}
inline Reply post(const TestServer& s, const std::string& path, const Json& body, httplib::Headers headers = {}) {
  return post(s, path, body.dump(), "application/json", std::move(headers));
}
inline Reply get(const TestServer& s, const std::string& path, httplib::Headers headers = {}) {
  return reply_of(s.client().Get(path.c_str(), headers));
}

// The "data:" payloads of an SSE body, "[DONE]" as a string.
inline std::vector<Json> sse_events(const std::string& body) {
  std::vector<Json> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string payload = body.substr(at + 6, end - at - 6);
    out.push_back(payload == "[DONE]" ? Json("[DONE]") : Json::parse(payload, nullptr, false));
    at = end;
  }
  return out;
}

inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// A bare TCP client: sends a request and hangs up whenever the test says so.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << "connect failed";
  }
  ~RawConnection() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send_request(const std::string& path, const std::string& body) {
    const std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd_, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  }
  void send_raw(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  // Reads until the server closes the connection (or the timeout); returns everything read.
  // closed() then says which of the two happened.
  std::string read_to_close(std::chrono::milliseconds timeout = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!closed_ && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) closed_ = true;
      else received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }
  bool closed() const { return closed_; }
  int fd() const { return fd_; }
  // Reads until `needle` has arrived (or the timeout); returns everything read so far.
  std::string read_until(const std::string& needle, std::chrono::milliseconds timeout = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (received_.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }

 private:
  int fd_ = -1;
  std::string received_;
  bool closed_ = false;
};

inline const std::string kLighthouse = "Tell me about the lighthouse keeper and his cat.";

inline Json user_chat(const std::string& text, int max_tokens) {
  return {{"model", "tiny-a"},
          {"messages", Json::array({{{"role", "user"}, {"content", text}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// A generation that runs until its client goes away.
inline Json endless(bool stream) {
  Json j = user_chat("blocker", 1000000);
  j["ignore_eos"] = true;
  j["stream"] = stream;
  return j;
}


}  // namespace dsv4::server::test_server
