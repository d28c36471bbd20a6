#include "dsv4/server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "dsv4/server/chat_output.h"
#include "dsv4/server/peer_socket.h"
#include "dsv4/server/web_assets.h"
#include "dsv4/util/error.h"

namespace dsv4::server {
namespace {

using namespace std::chrono_literals;

// Each streaming response holds an HTTP worker thread for its whole duration, and so does an
// idle keep-alive connection until it times out; size the pool for every request the queue
// admits plus this many for quick requests (health, metrics, 429s, the page).
constexpr size_t kSpareHttpThreads = 32;
// How often a handler that waits for the engine checks whether its client is still there.
constexpr auto kClientCheckInterval = 100ms;
// An SSE comment this often while nothing else is sent, so proxies keep the stream open
// during a long prefill.
constexpr auto kKeepAliveComment = 10s;

struct Route {
  const char* path;
  const char* methods;  // for 405's Allow header
};
constexpr Route kApiRoutes[] = {
    {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/v1/models", "GET"},
    {"/health", "GET"},               {"/metrics", "GET"},
};

bool is_web_path(const std::string& path) {
  if (path == "/") return true;
  for (const WebAsset& a : web_assets())
    if (a.path == path) return true;
  return false;
}

// A bounded set of labels for metrics (never the raw client path).
std::string route_name(const std::string& path) {
  for (const Route& r : kApiRoutes)
    if (path == r.path) return r.path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (is_web_path(path)) return "web";
  return "other";
}

const char* allowed_methods(const std::string& path) {
  for (const Route& r : kApiRoutes)
    if (path == r.path) return r.methods;
  if (path.rfind("/v1/models/", 0) == 0 || is_web_path(path)) return "GET";
  return nullptr;
}

bool needs_api_key(const std::string& path) { return path.rfind("/v1/", 0) == 0 || path == "/metrics"; }

bool is_json_content_type(const std::string& value) {
  std::string v = value.substr(0, value.find(';'));
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "application/json";
}

// Compares without an early exit, so response timing does not reveal how much of a key matched.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// The host part of a Host header ("name:port", "[v6]:port", "name").
std::string host_without_port(const std::string& h) {
  if (!h.empty() && h[0] == '[') return h.substr(0, h.find(']') == std::string::npos ? h.size() : h.find(']') + 1);
  const size_t colon = h.find(':');
  return colon != std::string::npos && h.find(':', colon + 1) == std::string::npos ? h.substr(0, colon) : h;
}

void set_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.body(), "application/json");
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (h == "localhost" || h == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, h.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

std::string exposure_warning(const std::string& host, bool has_api_key) {
  if (has_api_key || is_loopback_host(host)) return "";
  return fmt::format("listening on {} without an API key: anyone who can reach this machine can use the model (set "
                     "--api-key or DSV4_API_KEY)",
                     host);
}

// ---- the server --------------------------------------------------------------------------

struct Server::Impl {
  Impl(Engine& e, const text::Tokenizer& t, ServerOptions o)
      : engine(e),
        tokenizer(t),
        options(std::move(o)),
        scheduler(e, t, metrics, options.scheduler),
        loopback(is_loopback_host(options.host)),
        started_at(unix_now()) {
    std::random_device rd;
    rng.seed((uint64_t{rd()} << 32) ^ rd());
    next_id = rng();
    install();
  }

  // One streamed response: what the content provider needs between its calls.
  struct Stream {
    std::shared_ptr<Job> job;
    ApiRequest request;
    ResponseHeader header;
    ChatOutputParser parser;
    bool tool_calls_sent = false;
  };

  void install();
  void handle_api(const httplib::Request& req, httplib::Response& res, ApiKind kind);
  JobInput make_job(const ApiRequest& r, Clock::time_point arrival);
  void respond_when_done(const httplib::Request& req, httplib::Response& res, const std::shared_ptr<Job>& job,
                         const ApiRequest& r, const ResponseHeader& h);
  bool pump_stream(Stream& st, httplib::DataSink& sink);
  std::string tool_call_prefix(const ResponseHeader& h) const { return "call_" + h.id.substr(h.id.find('-') + 1) + "_"; }
  uint64_t random_u64() {
    std::lock_guard lock(rng_mu);
    return rng();
  }

  Engine& engine;
  const text::Tokenizer& tokenizer;
  ServerOptions options;
  Metrics metrics;
  Scheduler scheduler;
  httplib::Server http;
  const bool loopback;
  const int64_t started_at;
  std::mutex rng_mu;
  std::mt19937_64 rng;
  std::atomic<uint64_t> next_id{0};

  std::atomic<bool> stopping{false}, run_entered{false}, run_returned{false};
  std::mutex stop_mu;
  std::thread thread;
};

void Server::Impl::install() {
  // cpp-httplib sets SO_REUSEPORT by default, which lets a second server bind the same port
  // silently (the kernel then splits connections between them). Plain SO_REUSEADDR only.
  http.set_socket_options([](socket_t s) {
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  });
  const size_t threads = options.scheduler.max_queue + 1 + kSpareHttpThreads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_keep_alive_max_count(100);
  // An idle keep-alive connection holds a worker, and delays shutdown, until this runs out.
  http.set_keep_alive_timeout(2);
  http.set_read_timeout(10);
  http.set_write_timeout(10);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (loopback && req.has_header("Host") && !is_loopback_host(host_without_port(req.get_header_value("Host")))) {
      set_error(res, ApiError{403, "invalid_request_error",
                              "This server listens on a loopback address and only answers requests for localhost.", "",
                              "forbidden_host"});
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!options.api_key.empty() && needs_api_key(req.path) &&
        !constant_time_equal(req.get_header_value("Authorization"), "Bearer " + options.api_key)) {
      set_error(res, ApiError{401, "invalid_request_error",
                              req.has_header("Authorization") ? "Incorrect API key provided."
                                                              : "Missing API key: send 'Authorization: Bearer <key>'.",
                              "", "invalid_api_key"});
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_header("Connection", "close");  // the body (if any) was not read
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Errors httplib produces itself (no route, body too large, unparsable HTTP) get the
  // OpenAI error shape too; responses our handlers wrote already have a body.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    // 499: a handler whose client left; nobody will read the body.
    if (!res.body.empty() || res.is_chunked_content_provider_ || res.status == 499)
      return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{res.status, "invalid_request_error", "", "", ""};
    if (res.status == 404) {
      if (const char* allow = allowed_methods(req.path)) {
        e.status = 405;
        e.message = fmt::format("Method {} is not allowed for {} (allowed: {}).", req.method, req.path, allow);
        e.code = "method_not_allowed";
        res.set_header("Allow", allow);
      } else {
        e.message = fmt::format("Unknown request URL: {} {}.", req.method, req.path);
        e.code = "unknown_url";
      }
    } else if (res.status == 413) {
      e.message = "The request body is too large.";
      e.code = "request_too_large";
      res.set_header("Connection", "close");  // the rest of the body was never read
    } else if (res.status == 414) {
      e.message = "The request URL is too long.";
    } else if (res.status >= 500) {
      e.type = "server_error";
      e.message = "Internal server error.";
    } else {
      e.message = "The HTTP request is malformed.";
      res.set_header("Connection", "close");
    }
    set_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    set_error(res, server_error(what));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.count_request(route_name(req.path), res.status);
    if (options.log_requests) fmt::print(stderr, "dsv4 serve: {} {} {}\n", req.method, req.path, res.status);
  });

  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_api(req, res, ApiKind::kChat); });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_api(req, res, ApiKind::kCompletion); });

  auto model_json = [this] {
    return Json{{"id", options.model_name},
                {"object", "model"},
                {"created", started_at},
                {"owned_by", "dsv4"},
                {"context_length", scheduler.context_limit()}};
  };
  http.Get("/v1/models", [model_json](const httplib::Request&, httplib::Response& res) {
    res.set_content(Json{{"object", "list"}, {"data", Json::array({model_json()})}}.dump(), "application/json");
  });
  http.Get(R"(/v1/models/(.+))", [this, model_json](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != options.model_name)
      return set_error(res, not_found_error(fmt::format("The model '{}' does not exist.", req.matches[1].str()),
                                            "model_not_found"));
    res.set_content(model_json().dump(), "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const SchedulerGauges g = scheduler.gauges();
    res.set_content(Json{{"status", "ok"}, {"model", options.model_name}, {"queue_depth", g.queue_depth}, {"running", g.running}}
                        .dump(),
                    "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(scheduler.gauges()), "text/plain; version=0.0.4; charset=utf-8");
  });

  for (const WebAsset& asset : web_assets()) {
    auto serve = [&asset](const httplib::Request&, httplib::Response& res) {
      res.set_content(asset.body.data(), asset.body.size(), std::string(asset.content_type));
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:");
    };
    http.Get(std::string(asset.path), serve);
    if (asset.path == "/index.html") http.Get("/", serve);
  }
}

JobInput Server::Impl::make_job(const ApiRequest& r, Clock::time_point arrival) {
  JobInput in;
  in.arrival = arrival;
  if (r.prompt_text.empty()) {
    in.prompt = r.prompt_ids;
  } else {
    in.prompt = tokenizer.encode(r.prompt_text);
    in.prompt_text = r.prompt_text;
  }
  const int64_t limit = scheduler.context_limit();
  if (static_cast<int64_t>(in.prompt.size()) >= limit)
    throw ApiException(ApiError{400, "invalid_request_error",
                                fmt::format("This model's maximum context length is {} tokens, but the prompt has {} "
                                            "tokens (at least one token must be left for the answer).",
                                            limit, in.prompt.size()),
                                r.kind == ApiKind::kChat ? "messages" : "prompt", "context_length_exceeded"});
  if (r.history_bytes > 0) {
    const size_t history = tokenizer.encode(std::string_view(r.prompt_text).substr(0, r.history_bytes)).size();
    if (history < in.prompt.size()) in.history_suffix = in.prompt.size() - history;
  }
  GenerationRequest& g = in.generation;
  g.sampling = r.sampling;
  g.sampling.seed = r.seed ? *r.seed : random_u64();
  try {
    g.sampling.validate();
  } catch (const Error& e) {
    throw_bad_request("", "invalid_value", e.what());
  }
  g.max_tokens = r.max_tokens;
  g.stop_strings = r.stop;
  if (!r.ignore_eos) g.stop_ids = {static_cast<int32_t>(engine.config().eos_token_id)};
  return in;
}

void Server::Impl::handle_api(const httplib::Request& req, httplib::Response& res, ApiKind kind) {
  const auto arrival = Clock::now();
  try {
    const std::string content_type = req.get_header_value("Content-Type");
    if (!is_json_content_type(content_type))
      throw ApiException(ApiError{415, "invalid_request_error",
                                  fmt::format("Content-Type must be application/json, got '{}'.", content_type), "",
                                  "unsupported_media_type"});
    const Json body = parse_json_body(req.body, options.limits);
    ApiRequest r = kind == ApiKind::kChat ? parse_chat_request(body, options.defaults, options.limits)
                                          : parse_completion_request(body, options.defaults, options.limits);
    if (r.model != options.model_name)
      throw ApiException(ApiError{404, "invalid_request_error",
                                  fmt::format("The model '{}' does not exist; this server serves '{}'.", r.model,
                                              options.model_name),
                                  "model", "model_not_found"});
    JobInput in = make_job(r, arrival);
    Scheduler::Submitted submitted = scheduler.submit(std::move(in));
    if (!submitted.job) {
      if (submitted.shutting_down)
        throw ApiException(ApiError{503, "server_error", "The server is shutting down.", "", "shutting_down"});
      metrics.count_rejected();
      res.set_header("Retry-After", std::to_string(scheduler.retry_after_s()));
      res.set_header("Connection", "close");  // free the HTTP worker for the next client
      throw ApiException(ApiError{429, "rate_limit_error",
                                  fmt::format("The server is busy: {} requests are already waiting. Retry later.",
                                              options.scheduler.max_queue),
                                  "", "queue_full"});
    }
    ResponseHeader h{fmt::format("{}-{:016x}", kind == ApiKind::kChat ? "chatcmpl" : "cmpl", next_id.fetch_add(1)),
                     unix_now(), options.model_name};
    if (!r.stream) return respond_when_done(req, res, submitted.job, r, h);

    auto st = std::make_shared<Stream>(
        Stream{submitted.job, r, h, ChatOutputParser(r.thinking, r.tools, tool_call_prefix(h)), false});
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [this, st](size_t, httplib::DataSink& sink) { return pump_stream(*st, sink); },
        [this, st](bool success) {
          if (!success) scheduler.cancel(st->job);  // the client went away mid-stream
        });
  } catch (const ApiException& e) {
    set_error(res, e.error());
  } catch (const std::exception& e) {
    set_error(res, server_error(e.what()));
  }
}

void Server::Impl::respond_when_done(const httplib::Request& req, httplib::Response& res,
                                     const std::shared_ptr<Job>& job, const ApiRequest& r, const ResponseHeader& h) {
  const auto peer = PeerSocket::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  std::string unused;  // the text arrives in the outcome
  while (!job->wait(kClientCheckInterval, unused)) {
    unused.clear();
    if (peer && peer->peer_closed()) {
      scheduler.cancel(job);
      res.status = 499;  // client closed the request (nginx's convention); nobody reads it
      res.set_content("", "text/plain");
      return;
    }
  }
  const JobOutcome& o = job->outcome();
  if (o.status == JobOutcome::Status::kFailed) return set_error(res, server_error(o.error));
  if (o.status != JobOutcome::Status::kDone)
    return set_error(res, ApiError{503, "server_error", "The server is shutting down.", "", "shutting_down"});
  const GenerationResult& g = o.result;
  if (r.kind == ApiKind::kChat) {
    ChatOutputParser parser(r.thinking, r.tools, tool_call_prefix(h));
    ChatDelta body = parser.feed(g.text);
    ChatDelta end = parser.finish();
    ChatAnswer answer{body.reasoning + end.reasoning, body.content + end.content, std::move(end.tool_calls)};
    const std::string finish = finish_reason_text(g.finish, !answer.tool_calls.empty());
    res.set_content(chat_completion_json(h, answer, r.thinking, finish, usage_json(g.stats), stats_json(g.stats, o.queue_s))
                        .dump(-1, ' ', false, Json::error_handler_t::replace),
                    "application/json");
  } else {
    res.set_content(completion_json(h, g.text, finish_reason_text(g.finish, false), usage_json(g.stats),
                                    stats_json(g.stats, o.queue_s))
                        .dump(-1, ' ', false, Json::error_handler_t::replace),
                    "application/json");
  }
}

bool Server::Impl::pump_stream(Stream& st, httplib::DataSink& sink) {
  const bool chat = st.request.kind == ApiKind::kChat;
  const ResponseHeader& h = st.header;
  auto send = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
  auto send_delta = [&](const ChatDelta& d) {
    if (!d.reasoning.empty() && !send(sse_event(chat_chunk_json(h, {{"reasoning_content", d.reasoning}}, ""))))
      return false;
    if (!d.content.empty() && !send(sse_event(chat_chunk_json(h, {{"content", d.content}}, "")))) return false;
    if (!d.tool_calls.empty()) {
      st.tool_calls_sent = true;
      if (!send(sse_event(chat_chunk_json(h, {{"tool_calls", tool_calls_json(d.tool_calls, true)}}, "")))) return false;
    }
    return true;
  };
  auto client_gone = [&] {
    scheduler.cancel(st.job);
    return false;
  };

  if (chat && !send(sse_event(chat_chunk_json(h, {{"role", "assistant"}, {"content", ""}}, ""))))
    return client_gone();
  std::string text;
  auto last_write = Clock::now();
  for (;;) {
    const bool done = st.job->wait(kClientCheckInterval, text);
    if (!text.empty()) {
      const bool ok = chat ? send_delta(st.parser.feed(text)) : send(sse_event(completion_chunk_json(h, text, "")));
      text.clear();
      if (!ok) return client_gone();
      last_write = Clock::now();
    }
    if (done) break;
    if (!sink.is_writable()) return client_gone();
    if (Clock::now() - last_write > kKeepAliveComment) {
      if (!send(": keep-alive\n\n")) return client_gone();
      last_write = Clock::now();
    }
  }

  const JobOutcome& o = st.job->outcome();
  if (o.status != JobOutcome::Status::kDone) {
    // Headers (200) are gone already; OpenAI's streams report late errors as an error event.
    const ApiError e = o.status == JobOutcome::Status::kFailed
                           ? server_error(o.error)
                           : ApiError{503, "server_error", "The server is shutting down.", "", "shutting_down"};
    send("data: " + e.body() + "\n\n");
    sink.done();
    return true;
  }
  const GenerationResult& g = o.result;
  std::string finish;
  if (chat) {
    if (!send_delta(st.parser.finish())) return client_gone();
    finish = finish_reason_text(g.finish, st.tool_calls_sent);
    Json last = chat_chunk_json(h, Json::object(), finish);
    last["stats"] = stats_json(g.stats, o.queue_s);
    if (!send(sse_event(last))) return client_gone();
  } else {
    Json last = completion_chunk_json(h, "", finish_reason_text(g.finish, false));
    last["stats"] = stats_json(g.stats, o.queue_s);
    if (!send(sse_event(last))) return client_gone();
  }
  if (st.request.include_usage &&
      !send(sse_event(usage_chunk_json(st.request.kind, h, usage_json(g.stats), stats_json(g.stats, o.queue_s)))))
    return client_gone();
  send("data: [DONE]\n\n");
  sink.done();
  return true;
}

// ---- lifetime ------------------------------------------------------------------------------

Server::Server(Engine& engine, const text::Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(options))) {}

Server::~Server() { stop(); }

int Server::bind() {
  const ServerOptions& o = impl_->options;
  if (o.port == 0) {
    const int port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) fail("cannot listen on {}: the address is not usable here", o.host);
    return port;
  }
  if (!impl_->http.bind_to_port(o.host, o.port))
    fail("cannot listen on {}:{}: the port is in use or the address is not usable here", o.host, o.port);
  return o.port;
}

void Server::run() {
  impl_->run_entered = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->run_returned = true;
}

void Server::start() {
  std::lock_guard lock(impl_->stop_mu);
  if (!impl_->thread.joinable()) impl_->thread = std::thread([this] { run(); });
}

void Server::stop() {
  std::lock_guard lock(impl_->stop_mu);
  impl_->stopping = true;
  // Handlers waiting for generations return once their jobs end.
  impl_->scheduler.stop();
  // httplib's stop() only acts once listening has begun: wait for that, unless run() was
  // never entered or has already returned.
  while (impl_->run_entered && !impl_->run_returned && !impl_->http.is_running()) std::this_thread::sleep_for(1ms);
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Scheduler& Server::scheduler() { return impl_->scheduler; }
Metrics& Server::metrics() { return impl_->metrics; }

}  // namespace dsv4::server
