// The HTTP front: OpenAI-compatible endpoints, /health, /metrics and the web chat page, on
// cpp-httplib (kept out of this header: it is slow to compile). Routes:
//   POST /v1/chat/completions, POST /v1/completions   (JSON or SSE; see openai_api.h)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus), / (web page)
// With an API key, /v1/* and /metrics need "Authorization: Bearer <key>". On a loopback
// address the Host header must name a loopback host too (a guard against DNS rebinding).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

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
  size_t max_body_bytes = setting_default<size_t>("max_body_mb") << 20;
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
