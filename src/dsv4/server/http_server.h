// The HTTP front: OpenAI- and Anthropic-compatible endpoints, /health, /metrics and the web chat page, on an
// event loop (Boost.Asio + Beast's HTTP/1.1 parser, kept out of this header: they are slow to
// compile). One thread runs every connection, so slow or idle clients cost a socket, not a
// thread; request bodies are parsed on a small pool of their own; generation runs on the
// scheduler's worker. Routes:
//   POST /v1/chat/completions, POST /v1/completions   (JSON or SSE; see openai_routes.h)
//   POST /v1/messages, POST /v1/messages/count_tokens (Anthropic; see anthropic_routes.h)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus), / (web page)
// With an API key, /v1/* and /metrics need "Authorization: Bearer <key>" (or "x-api-key:
// <key>"). On a loopback address the Host header must name a loopback host too (a guard
// against DNS rebinding). Any model id is answered by the served model unless strict_model is
// set. See docs/server.md for the limits and what each refusal looks like.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/model/engine.h"
#include "dsv4/server/metrics.h"
#include "dsv4/server/openai_api.h"
#include "dsv4/server/scheduler.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/runtime/settings.h"

namespace dsv4::server {

struct ServerOptions {
  std::string host = setting_default<std::string>("host");
  int port = setting_default<int>("port");  // 0: any free port (bind() returns it)
  std::string api_key;
  std::string model_name = "dsv4";
  std::vector<std::string> model_aliases;  // listed by /v1/models beside model_name
  bool strict_model = false;               // refuse ids other than model_name and the aliases
  size_t max_body_bytes = setting_default<size_t>("max_body_mb") << 20;
  // Bytes of request bodies being read or parsed at once (0: 4 x max_body_bytes); a request
  // whose body does not fit waits, unread, until others are done.
  size_t body_budget_bytes = 0;
  size_t max_connections = 256;  // more are closed at accept with a canned 503
  // The whole request head (and an idle keep-alive connection's wait for it), the body, and
  // each write must finish within these.
  std::chrono::milliseconds head_timeout{10'000};
  std::chrono::milliseconds body_timeout{60'000};
  std::chrono::milliseconds write_timeout{10'000};
  size_t parse_threads = 2;   // parse and tokenize request bodies
  bool log_requests = false;  // one line per request on stderr
  RequestDefaults defaults;
  RequestLimits limits;
  SchedulerOptions scheduler;
};

// Loopback names: localhost, 127.0.0.0/8, ::1 (with or without brackets).
bool is_loopback_host(const std::string& host);

// What to warn about before listening on `host`: "" on loopback or with an API key; otherwise
// that anyone who can reach the machine can use the model.
std::string exposure_warning(const std::string& host, bool has_api_key);

class Server {
 public:
  // The engine and tokenizer must outlive the server.
  Server(Engine& engine, const text::Tokenizer& tokenizer, ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Opens the listening socket; returns the port. Throws Error if the address is unusable
  // (e.g. the port is taken: SO_REUSEPORT is off, so a second server fails here).
  int bind();
  // Serves until stop() (call bind() first).
  void run();
  // run() on a thread of the server's own, joined by stop().
  void start();
  // Stops accepting, cancels queued and running generations, and waits for the handlers.
  // Safe from any thread (e.g. a signal watcher), and more than once.
  void stop();

  Scheduler& scheduler();
  Metrics& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::server
