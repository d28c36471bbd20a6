// The HTTP server: Server::Impl's state (the listener, connections, the body budget, the
// scheduler's waiters) and the coroutines that share it, in sections (routes, preparing a job,
// body budget, connections, generation requests, lifetime). Over 1,000 lines because every
// section is a member of that one private Impl; the request parsing, the two APIs, the chat
// output and the scheduler are their own files beside it.
#include "dsv4/server/http_server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <ctime>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>

#include "dsv4/platform/platform.h"
#include "dsv4/constrain/constraint_cache.h"
#include "dsv4/server/anthropic_api.h"
#include "dsv4/server/anthropic_routes.h"
#include "dsv4/server/beast_request.h"
#include "dsv4/server/chat_output.h"
#include "dsv4/server/openai_routes.h"
#include "dsv4/server/web_assets.h"
#include "dsv4/util/error.h"

// GCC 12 at -O1 with ASan warns that asio's coroutine frames (awaitable_frame_base: unsized
// operator new, sized operator delete, both through asio's recycling allocator) are freed by a
// "mismatched" function: a false positive (GCC PR 109224). ASan itself checks the pairing at run
// time (alloc_dealloc_mismatch) on every server test.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace dsv4::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using namespace std::chrono_literals;

// An SSE comment this often while nothing else is sent, so proxies keep the stream open
// during a long prefill.
constexpr auto kKeepAliveComment = 10s;
// Socket reads go through a buffer of this size (the head must fit in it).
constexpr size_t kReadBufferBytes = 64 << 10;
constexpr size_t kMaxHeadBytes = 16 << 10;
// After an error that left a body unread, the rest is read and dropped for this long before
// closing, so the client sees the response instead of a reset.
constexpr auto kLingerTime = 2s;
// Bodies at least this large are followed by malloc_trim once no body is in flight, so the
// process gives their memory back (glibc keeps freed large blocks otherwise).
constexpr size_t kTrimAfterBytes = 1 << 20;

// 499: the client went away before the answer was complete (nginx's convention); it is what
// the logs and metrics count, nobody receives it.
constexpr int kClientClosed = 499;

constexpr const char* kGetPaths[] = {"/v1/models", "/health", "/metrics"};

bool is_web_path(const std::string& path) {
  if (path == "/") return true;
  for (const WebAsset& a : web_assets())
    if (a.path == path) return true;
  return false;
}

bool needs_api_key(const std::string& path) { return path.rfind("/v1/", 0) == 0 || path == "/metrics"; }

bool is_json_content_type(const std::string& value) {
  std::string v = value.substr(0, value.find(';'));
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "application/json";
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
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

// A client path as it may appear in a log line: bounded, no control bytes.
std::string printable(std::string_view s) {
  std::string out(s.substr(0, 200));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return s.size() > 200 ? out + "..." : out;
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

using Headers = std::vector<std::pair<std::string, std::string>>;

// One response that is not a stream.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;
};

// X-DSV4-Schema-Warnings: the assertions a non-strict schema had dropped, "; "-separated
// places ("response_format.json_schema.schema.properties.id.pattern"), printable and bounded.
Headers schema_warning_headers(const std::vector<std::string>& dropped) {
  if (dropped.empty()) return {};
  constexpr size_t kMaxListed = 16;
  std::string value = "dropped unsupported keywords: ";
  for (size_t i = 0; i < dropped.size() && i < kMaxListed; ++i) value += (i ? "; " : "") + printable(dropped[i]);
  if (dropped.size() > kMaxListed) value += fmt::format("; and {} more", dropped.size() - kMaxListed);
  for (char& c : value)
    if (static_cast<unsigned char>(c) >= 0x80) c = '?';  // a header value stays ASCII
  return {{"X-DSV4-Schema-Warnings", value}};
}

Reply error_reply(const ApiError& e, std::string body = "") {
  return Reply{e.status, "application/json", body.empty() ? e.body() : std::move(body), {}};
}

// Anthropic's clients (the Messages API, or any request with an anthropic-version header) get
// Anthropic's error shape; everyone else OpenAI's.
bool wants_anthropic(const HttpHead& head) {
  return head.path().rfind("/v1/messages", 0) == 0 || head.find("anthropic-version") != nullptr;
}
Reply error_reply_for(const HttpHead& head, const ApiError& e) {
  return error_reply(e, wants_anthropic(head) ? anthropic::error_body(e) : e.body());
}

std::vector<GenerationRoute> all_routes(const ServerOptions& o, const text::Tokenizer& tokenizer) {
  std::vector<GenerationRoute> routes = openai_routes(o.defaults, o.limits, tokenizer);
  for (GenerationRoute& r : anthropic_routes(o.defaults, o.limits, tokenizer)) routes.push_back(std::move(r));
  return routes;
}

// Runs f() on `pool` and resumes the awaiting coroutine on its own executor with the result.
template <typename F>
awaitable<std::invoke_result_t<F&>> on_pool(net::thread_pool& pool, F f) {
  using R = std::invoke_result_t<F&>;
  return net::async_initiate<const net::use_awaitable_t<>&, void(R)>(
      [&pool](auto handler, F fn) {
        net::post(pool, [handler = std::move(handler), fn = std::move(fn)]() mutable {
          R result = fn();
          auto ex = net::get_associated_executor(handler);
          net::post(ex, [handler = std::move(handler), result = std::move(result)]() mutable {
            std::move(handler)(std::move(result));
          });
        });
      },
      use_awaitable, std::move(f));
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (h == "localhost" || h == "::1") return true;
  boost::system::error_code ec;
  const net::ip::address_v4 a = net::ip::make_address_v4(h, ec);
  return !ec && (a.to_uint() >> 24) == 127;
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
        routes(all_routes(options, t)),
        constraints(t),
        loopback(is_loopback_host(options.host)),
        started_at(unix_now()),
        body_budget(options.body_budget_bytes ? std::max(options.body_budget_bytes, options.max_body_bytes)
                                              : 4 * options.max_body_bytes),
        parse_pool(std::max<size_t>(1, options.parse_threads)) {
    std::random_device rd;
    rng.seed((uint64_t{rd()} << 32) ^ rd());
    next_id = rng();
  }

  // What a generation request has become once its body is parsed (on the parse pool).
  struct Prepared {
    std::optional<ApiError> error;
    ApiRequest request;
    std::vector<JobInput> choices;  // one job per choice (`n`)
    std::string answer;  // a route that answers at once (answer_at_once)
    std::vector<std::pair<std::string, std::string>> headers;  // for the answer (schema warnings)
  };

  // A handler waiting for its job: woken (timer cancelled) by the job's news or by the peer
  // watch noticing that the client closed the connection.
  struct Waiter {
    explicit Waiter(net::io_context& io) : wake(io) {}
    net::steady_timer wake;
    bool client_gone = false;
    // News arrived since the handler last looked: a cancel() that found no wait pending (the
    // handler was writing) would be lost otherwise, and the handler would sleep through it.
    bool news = false;
    // Waits for news (or `deadline`) unless some arrived already.
    awaitable<void> wait_until(Clock::time_point deadline) {
      if (std::exchange(news, false)) co_return;
      beast::error_code ec;
      wake.expires_at(deadline);
      co_await wake.async_wait(net::redirect_error(use_awaitable, ec));
      news = false;
    }
  };

  // An open connection, as the shutdown and the connection cap see it (io thread only).
  struct Connection {
    beast::tcp_stream* stream = nullptr;
    bool reading = true;  // waiting for a request or reading one: the shutdown closes it
  };

  // Bytes of bodies being read or parsed at once. A request whose body does not fit waits in
  // FIFO order (io thread only).
  struct BodyWaiter {
    explicit BodyWaiter(net::io_context& io, size_t n) : timer(io), bytes(n) {}
    net::steady_timer timer;
    size_t bytes;
    bool granted = false;
  };
  class BodyLease {
   public:
    BodyLease() = default;
    BodyLease(Impl* impl, size_t bytes) : impl_(impl), bytes_(bytes) {}
    BodyLease(BodyLease&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)), bytes_(o.bytes_) {}
    BodyLease& operator=(BodyLease&& o) noexcept {
      release();
      impl_ = std::exchange(o.impl_, nullptr);
      bytes_ = o.bytes_;
      return *this;
    }
    ~BodyLease() { release(); }
    explicit operator bool() const { return impl_ != nullptr; }
    void release() {
      if (impl_) std::exchange(impl_, nullptr)->release_body_bytes(bytes_);
    }

   private:
    Impl* impl_ = nullptr;
    size_t bytes_ = 0;
  };

  // Per request: what the log line and the metrics say at the end.
  struct Exchange {
    std::string method, path;
    int status = 0;
  };

  int bind();
  awaitable<void> accept_loop();
  void refuse(tcp::socket& socket);
  awaitable<void> serve(tcp::socket socket);
  awaitable<bool> serve_one(beast::tcp_stream& stream, beast::flat_buffer& buffer, Connection& conn);
  awaitable<bool> serve_generation(beast::tcp_stream& stream, beast::flat_buffer& buffer, Connection& conn,
                                   beast_request::Parser& parser, const HttpHead& head, const BodyFraming& framing,
                                   const GenerationRoute& route, Exchange& ex);
  awaitable<bool> send_answer(beast::tcp_stream& stream, const HttpHead& head, bool keep_alive,
                              const Jobs& jobs, const std::shared_ptr<Waiter>& waiter,
                              ResponseFormat& format, const GenerationRoute& route, const Headers& headers,
                              Exchange& ex);
  awaitable<bool> stream_answer(beast::tcp_stream& stream, const HttpHead& head, bool keep_alive,
                                const Jobs& jobs, const std::shared_ptr<Waiter>& waiter,
                                ResponseFormat& format, const Headers& headers, Exchange& ex);
  awaitable<bool> write_reply(beast::tcp_stream& stream, int version, Reply reply, bool keep_alive, Exchange& ex);
  awaitable<void> linger_close(beast::tcp_stream& stream, uint64_t announced_body_bytes = 0);
  awaitable<BodyLease> acquire_body_bytes(size_t bytes);
  void release_body_bytes(size_t bytes);
  void watch_peer(beast::tcp_stream& stream, const std::shared_ptr<Waiter>& waiter);
  std::optional<Reply> get_reply(const HttpHead& head);
  // Whether requests naming `model` are answered: the served name, an alias, or (without
  // --strict-model) any name at all.
  bool serves_model(const std::string& model) const;
  const GenerationRoute* generation_route(const std::string& path) const;
  const char* allowed_methods(const std::string& path) const;
  std::string route_name(const std::string& path) const;
  std::optional<ApiError> check_access(const HttpHead& head) const;
  Prepared prepare(const GenerationRoute& route, std::string body, Clock::time_point arrival);
  // The jobs of a request: one per choice, which differ only in their seeds (and rules' state).
  std::vector<JobInput> make_jobs(const ApiRequest& r, Clock::time_point arrival, std::vector<std::string>& dropped);
  void record(const Exchange& ex);
  void shutdown_connections();
  uint64_t random_u64() {
    std::lock_guard lock(rng_mu);
    return rng();
  }

  Engine& engine;
  const text::Tokenizer& tokenizer;
  ServerOptions options;
  Metrics metrics;
  // Before the event loop: handlers destroyed with the loop give their reservations back.
  Scheduler scheduler;
  std::vector<GenerationRoute> routes;
  constrain::ConstraintCache constraints;  // compiled response formats / forced tool calls
  const bool loopback;
  const int64_t started_at;
  std::mutex rng_mu;
  std::mt19937_64 rng;
  std::atomic<uint64_t> next_id{0};

  net::io_context io{1};
  tcp::acceptor acceptor{io};
  // io thread only:
  std::list<Connection*> connections;
  const size_t body_budget;
  size_t body_bytes_in_use = 0;
  size_t big_bodies_since_trim = 0;
  std::deque<std::shared_ptr<BodyWaiter>> body_waiters;
  bool shutting_down = false;

  std::atomic<size_t> open_connections{0};
  std::atomic<bool> stopping{false}, run_entered{false}, run_returned{false};
  std::mutex stop_mu;
  std::thread thread;
  net::thread_pool parse_pool;
};

// ---- routes ---------------------------------------------------------------------------------

const GenerationRoute* Server::Impl::generation_route(const std::string& path) const {
  for (const GenerationRoute& r : routes)
    if (r.path == path) return &r;
  return nullptr;
}

const char* Server::Impl::allowed_methods(const std::string& path) const {
  if (generation_route(path)) return "POST";
  for (const char* p : kGetPaths)
    if (path == p) return "GET";
  if (path.rfind("/v1/models/", 0) == 0 || is_web_path(path)) return "GET";
  return nullptr;
}

// A bounded set of labels for metrics (never the raw client path).
std::string Server::Impl::route_name(const std::string& path) const {
  if (const GenerationRoute* r = generation_route(path)) return r->path;
  for (const char* p : kGetPaths)
    if (path == p) return p;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (is_web_path(path)) return "web";
  return "other";
}

bool Server::Impl::serves_model(const std::string& model) const {
  if (!options.strict_model || model == options.model_name) return true;
  return std::find(options.model_aliases.begin(), options.model_aliases.end(), model) != options.model_aliases.end();
}

std::optional<Reply> Server::Impl::get_reply(const HttpHead& head) {
  const std::string path = head.path();
  // The served name and its aliases, in OpenAI's shape or (for Anthropic's clients, which send
  // anthropic-version) in Anthropic's.
  const bool anthropic = head.find("anthropic-version") != nullptr;
  auto model_json = [this, anthropic](const std::string& id) {
    if (anthropic) {
      const std::string created = fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(static_cast<std::time_t>(started_at)));
      return Json{{"type", "model"}, {"id", id}, {"display_name", id}, {"created_at", created}};
    }
    return Json{{"id", id},
                {"object", "model"},
                {"created", started_at},
                {"owned_by", "dsv4"},
                {"root", options.model_name},
                {"context_length", scheduler.context_limit()}};
  };
  if (path == "/health") {
    const SchedulerGauges g = scheduler.gauges();
    // Degraded (still serving) while storage is unwell: a shard refused, replaced or
    // deleted, or experts whose last read failed a request.
    const std::string problem = engine.experts().storage_problem();
    Json body{{"status", problem.empty() ? "ok" : "degraded"}, {"model", options.model_name},
              {"queue_depth", g.queue_depth}, {"running", g.running}, {"running_slots", g.running_count},
              {"slots", g.slots}};
    if (!problem.empty()) body["reason"] = problem;
    return Reply{200, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace), {}};
  }
  if (path == "/metrics")
    return Reply{200, "text/plain; version=0.0.4; charset=utf-8", metrics.render(scheduler.gauges()), {}};
  if (path == "/v1/models") {
    Json data = Json::array({model_json(options.model_name)});
    for (const std::string& alias : options.model_aliases) data.push_back(model_json(alias));
    const Json list = anthropic ? Json{{"data", data}, {"has_more", false}, {"first_id", data.front()["id"]},
                                       {"last_id", data.back()["id"]}}
                                : Json{{"object", "list"}, {"data", data}};
    return Reply{200, "application/json", list.dump(), {}};
  }
  if (path.rfind("/v1/models/", 0) == 0) {
    const std::string id = path.substr(11);
    if (!serves_model(id))
      return error_reply_for(head, not_found_error(fmt::format("The model '{}' does not exist.", printable(id)),
                                                   "model_not_found"));
    return Reply{200, "application/json", model_json(id).dump(-1, ' ', false, Json::error_handler_t::replace), {}};
  }
  for (const WebAsset& asset : web_assets()) {
    if (asset.path == path || (path == "/" && asset.path == "/index.html"))
      return Reply{200,
                   std::string(asset.content_type),
                   std::string(asset.body),
                   {{"Cache-Control", "no-cache"},
                    {"X-Content-Type-Options", "nosniff"},
                    {"Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; connect-src "
                                                "'self'; img-src 'self' data:"}}};
  }
  return std::nullopt;
}

// The Host guard and the API key, both decided on the head alone.
std::optional<ApiError> Server::Impl::check_access(const HttpHead& head) const {
  if (loopback && head.find("Host") && !is_loopback_host(host_without_port(head.value("Host"))))
    return ApiError{403, "invalid_request_error",
                    "This server listens on a loopback address and only answers requests for localhost.", "",
                    "forbidden_host"};
  if (!options.api_key.empty() && needs_api_key(head.path())) {
    const std::string* bearer = head.find("Authorization");
    const std::string* x_key = head.find("x-api-key");
    const bool ok = (bearer && constant_time_equal(*bearer, "Bearer " + options.api_key)) ||
                    (x_key && constant_time_equal(*x_key, options.api_key));
    if (!ok)
      return ApiError{401, "invalid_request_error",
                      bearer || x_key ? "Incorrect API key provided."
                                      : "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                      "", "invalid_api_key"};
  }
  return std::nullopt;
}

// ---- preparing a job (parse pool) -----------------------------------------------------------

std::vector<JobInput> Server::Impl::make_jobs(const ApiRequest& r, Clock::time_point arrival,
                                              std::vector<std::string>& dropped) {
  JobInput in;
  in.arrival = arrival;
  const int64_t limit = scheduler.context_limit();
  if (r.prompt_text.empty()) {
    in.prompt = r.prompt_ids;
  } else {
    // Encoding stops past the limit, so an over-long prompt costs what the limit costs.
    in.prompt = tokenizer.encode(r.prompt_text, r.prompt_caller, static_cast<size_t>(limit) + 1);
    in.prompt_text = r.prompt_text;
  }
  if (static_cast<int64_t>(in.prompt.size()) >= limit)
    throw ApiException(ApiError{400, "invalid_request_error",
                                fmt::format("This model's maximum context length is {} tokens, but the prompt has {} "
                                            "tokens (at least one token must be left for the answer).",
                                            limit, static_cast<int64_t>(in.prompt.size()) > limit
                                                       ? fmt::format("more than {}", limit)
                                                       : std::to_string(in.prompt.size())),
                                r.kind == ApiKind::kCompletion ? "prompt" : "messages", "context_length_exceeded"});
  if (r.history_bytes > 0) {
    // The history ends where the last turn's <｜User｜> token begins.
    const std::vector<size_t> offsets = tokenizer.token_offsets(in.prompt);
    const auto end = std::lower_bound(offsets.begin(), offsets.end(), r.history_bytes);
    if (end != offsets.end() && *end == r.history_bytes && end + 1 < offsets.end())
      in.history_suffix = static_cast<size_t>(offsets.end() - 1 - end);
  }
  if (r.kind == ApiKind::kCompletion)
    in.show_special = r.special_tokens ? text::IncrementalDecoder::ShowSpecial() : [](int32_t) { return false; };
  else
    in.show_special = text::chat::answer_specials(
        tokenizer, r.thinking ? text::chat::ThinkingMode::kThinking : text::chat::ThinkingMode::kChat, r.tools);
  GenerationRequest& g = in.generation;
  g.sampling = r.sampling;
  const uint64_t seed = r.seed ? *r.seed : random_u64();
  g.sampling.seed = seed;
  try {
    g.sampling.validate();
  } catch (const Error& e) {
    throw_bad_request("", "invalid_value", e.what());
  }
  g.max_tokens = r.max_tokens;
  g.stop_strings = r.stop;
  if (r.output.active()) {
    try {
      g.constraint = constraints.get(answer_format(r.output, r.thinking), &dropped);
    } catch (const constrain::SchemaError& e) {
      throw_bad_request(e.param(), "unsupported_schema", e.what());
    } catch (const Error& e) {
      throw_bad_request(r.output.calls_required ? "tool_choice" : r.output.content_param, "invalid_value", e.what());
    }
    // The answer must fit: below its shortest complete form it could only be cut short.
    const int64_t need = g.constraint->min_tokens();
    if (r.max_tokens < need && options.scheduler.steer_to_budget)
      throw_bad_request("max_tokens", "invalid_value",
                        fmt::format("max_tokens is {}, but the shortest complete answer in the requested format ({}) "
                                    "takes {} tokens: ask for at least {}.",
                                    r.max_tokens, r.output.calls_required ? "a tool call" : "the JSON schema", need, need));
    if (limit - static_cast<int64_t>(in.prompt.size()) < need)
      throw ApiException(ApiError{400, "invalid_request_error",
                                  fmt::format("This model's maximum context length is {} tokens; the prompt has {} "
                                              "tokens, which leaves too few for the shortest complete answer in the "
                                              "requested format ({} tokens).",
                                              limit, in.prompt.size(), need),
                                  r.kind == ApiKind::kCompletion ? "prompt" : "messages", "context_length_exceeded"});
  }
  g.spec = r.spec;
  g.draft_max = r.draft_max;
  if (!r.ignore_eos) g.stop_ids = {static_cast<int32_t>(engine.config().eos_token_id)};
  g.top_logprobs = r.top_logprobs;
  AnswerRules rules;
  if (auto dsml = tokenizer.token_id(text::chat::kDsml); dsml && r.no_tool_calls) rules.banned.push_back(*dsml);
  if (auto think_end = tokenizer.token_id(text::chat::kThinkEnd); think_end && r.thinking_budget > 0) {
    rules.think_end = *think_end;
    rules.thinking_budget = r.thinking_budget;
  }
  std::vector<JobInput> choices(static_cast<size_t>(std::max(1, r.n)), in);
  for (size_t i = 0; i < choices.size(); ++i) {
    // Choice i is what a request with seed + i gives alone (documented in docs/server.md).
    choices[i].generation.sampling.seed = seed + i;
    choices[i].generation.logits_filter = answer_logits_filter(rules);  // each its own progress
  }
  return choices;
}

Server::Impl::Prepared Server::Impl::prepare(const GenerationRoute& route, std::string body, Clock::time_point arrival) {
  Prepared p;
  try {
    {
      const Json json = parse_json_body(body, options.limits, &route.fields);
      std::string().swap(body);  // the raw bytes are not needed any more
      p.request = route.parse(json);
    }
    if (!serves_model(p.request.model))
      throw ApiException(ApiError{404, "invalid_request_error",
                                  fmt::format("The model '{}' does not exist; this server serves '{}'{}.",
                                              printable(p.request.model), options.model_name,
                                              options.model_aliases.empty() ? "" : " and its aliases"),
                                  "model", "model_not_found"});
    if (route.answer_at_once) {
      p.answer = route.answer_at_once(p.request);
      return p;
    }
    std::vector<std::string> dropped;
    p.choices = make_jobs(p.request, arrival, dropped);
    p.headers = schema_warning_headers(dropped);
  } catch (const ApiException& e) {
    p.error = e.error();
  } catch (const std::exception& e) {
    p.error = server_error(e.what());
  }
  return p;
}

// ---- body budget ------------------------------------------------------------------------------

awaitable<Server::Impl::BodyLease> Server::Impl::acquire_body_bytes(size_t bytes) {
  if (shutting_down) co_return BodyLease();
  if (body_waiters.empty() && body_bytes_in_use + bytes <= body_budget) {
    body_bytes_in_use += bytes;
    co_return BodyLease(this, bytes);
  }
  auto w = std::make_shared<BodyWaiter>(io, bytes);
  body_waiters.push_back(w);
  w->timer.expires_after(options.body_timeout);
  beast::error_code ec;
  co_await w->timer.async_wait(net::redirect_error(use_awaitable, ec));
  if (w->granted) co_return BodyLease(this, bytes);
  std::erase(body_waiters, w);
  co_return BodyLease();
}

void Server::Impl::release_body_bytes(size_t bytes) {
  body_bytes_in_use -= bytes;
  if (bytes >= kTrimAfterBytes) ++big_bodies_since_trim;
  while (!body_waiters.empty() && body_bytes_in_use + body_waiters.front()->bytes <= body_budget) {
    std::shared_ptr<BodyWaiter> w = std::move(body_waiters.front());
    body_waiters.pop_front();
    body_bytes_in_use += w->bytes;
    w->granted = true;
    w->timer.cancel();
  }
  if (body_bytes_in_use == 0 && big_bodies_since_trim > 0) {
    big_bodies_since_trim = 0;
    net::post(parse_pool, [] { platform::release_free_memory(); });
  }
}

// ---- connections ------------------------------------------------------------------------------

int Server::Impl::bind() {
  std::string host = options.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(options.port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) fail("cannot listen on {}: the address is not usable here ({})", options.host, ec.message());
  const tcp::endpoint endpoint = results.begin()->endpoint();
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);  // not SO_REUSEPORT: a second server fails
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    acceptor.close();
    if (options.port == 0) fail("cannot listen on {}: the address is not usable here ({})", options.host, ec.message());
    fail("cannot listen on {}:{}: the port is in use or the address is not usable here ({})", options.host, options.port,
         ec.message());
  }
  return acceptor.local_endpoint().port();
}

awaitable<void> Server::Impl::accept_loop() {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(net::redirect_error(use_awaitable, ec));
    if (shutting_down || ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: wait a moment rather than spin.
      net::steady_timer pause(io, 50ms);
      co_await pause.async_wait(net::redirect_error(use_awaitable, ec));
      continue;
    }
    if (connections.size() >= options.max_connections) {
      refuse(socket);
      continue;
    }
    net::co_spawn(io, serve(std::move(socket)), net::detached);
  }
}

// Over the connection cap: a canned answer written without waiting, then close.
void Server::Impl::refuse(tcp::socket& socket) {
  static const std::string kBody =
      ApiError{503, "server_error", "The server has too many open connections; retry later.", "", "too_many_connections"}
          .body();
  static const std::string kResponse = fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: "
      "1\r\nConnection: close\r\n\r\n{}",
      kBody.size(), kBody);
  beast::error_code ec;
  socket.non_blocking(true, ec);
  socket.send(net::buffer(kResponse), 0, ec);  // whatever fits; Asio never raises SIGPIPE
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
  metrics.count_refused_connection();
}

awaitable<void> Server::Impl::serve(tcp::socket socket) {
  beast::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);  // stream events go out as they are written
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer(kReadBufferBytes);
  Connection conn{&stream, true};
  connections.push_back(&conn);
  ++open_connections;
  metrics.connection_opened();
  try {
    while (!shutting_down && co_await serve_one(stream, buffer, conn)) {
    }
  } catch (const std::exception& e) {
    // Nothing in serve_one throws by design; if something does, this connection ends and the
    // server goes on.
    if (options.log_requests) fmt::print(stderr, "dsv4 serve: connection error: {}\n", e.what());
  }
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.close();
  connections.remove(&conn);
  metrics.connection_closed();
  --open_connections;
}

// Reads and drops what the client still sends before closing: closing with unread bytes makes
// the kernel send a reset, and a client still writing its body then loses the answer (a
// too-large body gets no 413, only a broken pipe). A body the head announced is drained in
// full up to 4 x max_body_bytes; the deadline bounds a client that trickles.
awaitable<void> Server::Impl::linger_close(beast::tcp_stream& stream, uint64_t announced_body_bytes) {
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream.expires_after(kLingerTime);
  std::vector<char> sink(16 << 10);
  const uint64_t limit = std::max<uint64_t>(options.max_body_bytes,
                                            std::min<uint64_t>(announced_body_bytes, 4 * uint64_t{options.max_body_bytes}));
  uint64_t dropped = 0;
  while (!ec && dropped <= limit)
    dropped += co_await stream.async_read_some(net::buffer(sink), net::redirect_error(use_awaitable, ec));
}

void Server::Impl::record(const Exchange& ex) {
  metrics.count_request(route_name(ex.path), ex.status);
  if (options.log_requests) fmt::print(stderr, "dsv4 serve: {} {} {}\n", printable(ex.method), printable(ex.path), ex.status);
}

awaitable<bool> Server::Impl::write_reply(beast::tcp_stream& stream, int version, Reply reply, bool keep_alive,
                                          Exchange& ex) {
  http::response<http::string_body> res{static_cast<http::status>(reply.status), static_cast<unsigned>(version)};
  res.set(http::field::server, "dsv4");
  res.set(http::field::content_type, reply.content_type);
  for (const auto& [k, v] : reply.headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.body() = std::move(reply.body);
  res.prepare_payload();
  ex.status = reply.status;
  record(ex);
  beast::error_code ec;
  stream.expires_after(options.write_timeout);
  co_await http::async_write(stream, res, net::redirect_error(use_awaitable, ec));
  co_return !ec && keep_alive;
}

awaitable<bool> Server::Impl::serve_one(beast::tcp_stream& stream, beast::flat_buffer& buffer, Connection& conn) {
  beast_request::Parser parser;
  beast_request::configure(parser, HttpLimits{kMaxHeadBytes, options.max_body_bytes});
  conn.reading = true;
  stream.expires_after(options.head_timeout);
  beast::error_code ec;
  co_await http::async_read_header(stream, buffer, parser, net::redirect_error(use_awaitable, ec));
  conn.reading = false;
  Exchange ex{"-", "-", 0};
  if (ec) {
    // A clean close, a reset, the shutdown, or an idle keep-alive connection timing out with
    // nothing sent: no request, nothing to answer.
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == net::error::eof || (ec == beast::error::timeout && buffer.size() == 0))
      co_return false;
    if (ec == beast::error::timeout) {
      // The head did not arrive within head_timeout (a slow or stalled client); the stream
      // has been closed by the deadline, so this is only counted.
      ex.status = 408;
      record(ex);
      co_return false;
    }
    Reply r = error_reply(beast_request::error_for(ec));
    co_await write_reply(stream, 11, std::move(r), false, ex);
    co_await linger_close(stream);
    co_return false;
  }
  const HttpHead head = beast_request::head_of(parser.get());
  ex.method = head.method;
  ex.path = head.path();
  BodyFraming framing;
  if (auto e = check_head(head, framing)) {
    Reply r = error_reply_for(head, *e);
    co_await write_reply(stream, head.version == 10 ? 10 : 11, std::move(r), false, ex);
    co_await linger_close(stream);
    co_return false;
  }
  // An answer given before the body is read closes the connection (the body's bytes would be
  // taken for the next request otherwise).
  const bool keep_alive = parser.get().keep_alive() && !shutting_down;
  auto early_reply = [&](Reply r) -> awaitable<bool> {
    const bool body_unread = framing.has_body();
    const bool again = co_await write_reply(stream, head.version, std::move(r), keep_alive && !body_unread, ex);
    if (body_unread) co_await linger_close(stream, framing.content_length);
    co_return again && !body_unread;
  };

  if (auto e = check_access(head)) {
    Reply r = error_reply_for(head, *e);
    if (e->status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
    co_return co_await early_reply(std::move(r));
  }
  const std::string path = head.path();
  if (const GenerationRoute* route = generation_route(path); route && head.method == "POST")
    co_return co_await serve_generation(stream, buffer, conn, parser, head, framing, *route, ex);
  if (head.method == "GET") {
    if (std::optional<Reply> r = get_reply(head)) co_return co_await early_reply(std::move(*r));
  }
  if (const char* allow = allowed_methods(path)) {
    Reply r = error_reply_for(head, ApiError{405, "invalid_request_error",
                                   fmt::format("Method {} is not allowed for {} (allowed: {}).", printable(head.method),
                                               printable(path), allow),
                                   "", "method_not_allowed"});
    r.headers.emplace_back("Allow", allow);
    co_return co_await early_reply(std::move(r));
  }
  Reply unknown = error_reply_for(head, 
      ApiError{404, "invalid_request_error",
               fmt::format("Unknown request URL: {} {}.", printable(head.method), printable(path)), "", "unknown_url"});
  co_return co_await early_reply(std::move(unknown));
}

// ---- generation requests ----------------------------------------------------------------------

awaitable<bool> Server::Impl::serve_generation(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                               Connection& conn, beast_request::Parser& parser, const HttpHead& head,
                                               const BodyFraming& framing, const GenerationRoute& route, Exchange& ex) {
  const auto arrival = Clock::now();
  const bool keep_alive = parser.get().keep_alive() && !shutting_down;
  auto error_body = [&](const ApiError& e) { return route.error_body ? route.error_body(e) : e.body(); };
  // Errors before the body is read: answered, then the connection is closed.
  auto refuse_unread = [&](const ApiError& e, std::vector<std::pair<std::string, std::string>> headers) -> awaitable<bool> {
    Reply r = error_reply(e, error_body(e));
    r.headers = std::move(headers);
    co_await write_reply(stream, head.version, std::move(r), false, ex);
    if (framing.has_body()) co_await linger_close(stream, framing.content_length);
    co_return false;
  };

  // (GCC 12 miscompiles temporaries in co_await expressions, string literals included: the
  // errors are built first, and co_await only sees named values.)
  std::optional<ApiError> refusal;
  std::vector<std::pair<std::string, std::string>> refusal_headers;
  const std::string content_type = head.value("Content-Type");
  const std::string expect = head.value("Expect");
  if (!is_json_content_type(content_type))
    refusal = ApiError{415, "invalid_request_error",
                       fmt::format("Content-Type must be application/json, got '{}'.", printable(content_type)), "",
                       "unsupported_media_type"};
  else if (!framing.chunked && framing.content_length > options.max_body_bytes)
    refusal = ApiError{413, "invalid_request_error", "The request body is too large.", "", "request_too_large"};
  else if (!expect.empty() && !iequals(expect, "100-continue"))
    refusal = ApiError{417, "invalid_request_error", fmt::format("Unsupported Expect: '{}'.", printable(expect)), "", ""};
  if (refusal) co_return co_await refuse_unread(*refusal, std::move(refusal_headers));

  // The queue decision, before the body is read (a route answered at once takes no place).
  Scheduler::Admission admission;
  if (!route.answer_at_once) admission = scheduler.reserve();
  if (!route.answer_at_once && !admission.slot) {
    if (admission.shutting_down) {
      refusal = ApiError{503, "server_error", "The server is shutting down.", "", "shutting_down"};
    } else {
      metrics.count_rejected();
      refusal = ApiError{
          429, "rate_limit_error",
          fmt::format("The server is busy: {} requests are already waiting. Retry later.", options.scheduler.max_queue),
          "", "queue_full"};
      refusal_headers.emplace_back("Retry-After", std::to_string(scheduler.retry_after_s()));
    }
    co_return co_await refuse_unread(*refusal, std::move(refusal_headers));
  }
  conn.reading = true;
  BodyLease lease = co_await acquire_body_bytes(framing.chunked ? options.max_body_bytes : framing.content_length);
  if (!lease) {
    refusal = shutting_down ? ApiError{503, "server_error", "The server is shutting down.", "", "shutting_down"}
                            : ApiError{503, "server_error", "The server is busy reading other requests; retry later.",
                                       "", "server_busy"};
    refusal_headers.emplace_back("Retry-After", "1");
    co_return co_await refuse_unread(*refusal, std::move(refusal_headers));
  }
  beast::error_code ec;
  if (!head.value("Expect").empty()) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    stream.expires_after(options.write_timeout);
    co_await net::async_write(stream, net::buffer(kContinue), net::redirect_error(use_awaitable, ec));
    if (ec) co_return false;
  }
  beast_request::set_body_limit(parser, HttpLimits{kMaxHeadBytes, options.max_body_bytes});
  stream.expires_after(options.body_timeout);
  co_await http::async_read(stream, buffer, parser, net::redirect_error(use_awaitable, ec));
  conn.reading = false;
  if (ec) {
    if (ec == beast::error::timeout) {
      ex.status = 408;  // the stream is closed already
      record(ex);
      co_return false;
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == http::error::partial_message || ec == net::error::operation_aborted) {
      ex.status = shutting_down ? 503 : kClientClosed;
      record(ex);
      co_return false;
    }
    const ApiError e = beast_request::error_for(ec);
    Reply r = error_reply(e, error_body(e));
    co_await write_reply(stream, head.version, std::move(r), false, ex);
    co_await linger_close(stream);
    co_return false;
  }

  // (Named, not a temporary in the co_await expression: GCC 12 destroys such temporaries twice.)
  auto parse = [this, &route, body = std::move(parser.get().body()), arrival]() mutable {
    return prepare(route, std::move(body), arrival);
  };
  Prepared p = co_await on_pool(parse_pool, std::move(parse));
  lease.release();
  if (p.error) {
    Reply r = error_reply(*p.error, error_body(*p.error));
    co_return co_await write_reply(stream, head.version, std::move(r), keep_alive, ex);
  }
  if (route.answer_at_once) {
    Reply r{200, "application/json", std::move(p.answer), {}};
    co_return co_await write_reply(stream, head.version, std::move(r), keep_alive, ex);
  }

  auto waiter = std::make_shared<Waiter>(io);
  std::weak_ptr<Waiter> weak = waiter;
  const Jobs jobs = scheduler.submit_choices(std::move(admission.slot), std::move(p.choices), [this, weak] {
    net::post(io, [weak] {
      if (auto w = weak.lock()) {
        w->news = true;
        w->wake.cancel();
      }
    });
  });
  if (jobs.empty()) {
    const ApiError e{503, "server_error", "The server is shutting down.", "", "shutting_down"};
    Reply r = error_reply(e, error_body(e));
    co_return co_await write_reply(stream, head.version, std::move(r), false, ex);
  }
  const ResponseHeader h{fmt::format("{}{:016x}", route.id_prefix, next_id.fetch_add(1)), unix_now(), options.model_name};
  std::unique_ptr<ResponseFormat> format = route.format(p.request, h, jobs);
  if (p.request.stream) co_return co_await stream_answer(stream, head, keep_alive, jobs, waiter, *format, p.headers, ex);
  co_return co_await send_answer(stream, head, keep_alive, jobs, waiter, *format, route, p.headers, ex);
}

// Watches the socket while a handler waits for the engine: a closed connection (or one reset
// by the peer) sets client_gone and wakes the handler. Pending request bytes (a pipelining
// client) mean the client is still there: the watch then ends.
void Server::Impl::watch_peer(beast::tcp_stream& stream, const std::shared_ptr<Waiter>& waiter) {
  tcp::socket* socket = &stream.socket();
  socket->async_wait(tcp::socket::wait_read, [waiter, socket](const beast::error_code& ec) {
    if (ec) return;  // cancelled (the answer is complete, or the socket closed): it is not read
    // A peek that does not block: bytes (a pipelined request) or "would block" mean the
    // client is there; end of stream or a reset means it left. Asio's own async reads on the
    // socket are unaffected by the non-blocking mode.
    char c;
    beast::error_code peek;
    socket->non_blocking(true, peek);
    const size_t n = socket->receive(net::buffer(&c, 1), tcp::socket::message_peek, peek);
    if ((n == 0 && !peek) || (peek && peek != net::error::would_block && peek != net::error::try_again &&
                              peek != net::error::interrupted)) {
      waiter->client_gone = true;
      waiter->news = true;
      waiter->wake.cancel();
    }
  });
}

namespace {

std::vector<const JobOutcome*> outcomes_of(const Jobs& jobs) {
  std::vector<const JobOutcome*> out;
  for (const std::shared_ptr<Job>& j : jobs) out.push_back(&j->outcome());
  return out;
}

// The error of a request whose jobs did not all finish: the first failure's, else the shutdown.
std::optional<ApiError> jobs_error(const Jobs& jobs) {
  for (const std::shared_ptr<Job>& j : jobs)
    if (j->outcome().status == JobOutcome::Status::kFailed) return server_error(j->outcome().error);
  for (const std::shared_ptr<Job>& j : jobs)
    if (j->outcome().status != JobOutcome::Status::kDone)
      return ApiError{503, "server_error", "The server is shutting down.", "", "shutting_down"};
  return std::nullopt;
}

}  // namespace

awaitable<bool> Server::Impl::send_answer(beast::tcp_stream& stream, const HttpHead& head, bool keep_alive,
                                          const Jobs& jobs, const std::shared_ptr<Waiter>& waiter,
                                          ResponseFormat& format, const GenerationRoute& route,
                                          const Headers& headers, Exchange& ex) {
  watch_peer(stream, waiter);
  beast::error_code ec;
  auto all_done = [&] {
    bool done = true;
    std::string unused;  // the text arrives in the outcome
    for (const std::shared_ptr<Job>& j : jobs) done = j->take(unused) && done;
    return done;
  };
  while (!all_done()) {
    if (waiter->client_gone) {
      for (const std::shared_ptr<Job>& j : jobs) scheduler.cancel(j);
      ex.status = kClientClosed;
      record(ex);
      co_return false;
    }
    co_await waiter->wait_until(Clock::now() + 1h);
  }
  stream.socket().cancel(ec);  // ends the peer watch
  if (const std::optional<ApiError> e = jobs_error(jobs)) {
    Reply failure = error_reply(*e, route.error_body ? route.error_body(*e) : e->body());
    co_return co_await write_reply(stream, head.version, std::move(failure), false, ex);
  }
  Reply answer{200, "application/json", format.complete(outcomes_of(jobs)), headers};
  co_return co_await write_reply(stream, head.version, std::move(answer), keep_alive, ex);
}

awaitable<bool> Server::Impl::stream_answer(beast::tcp_stream& stream, const HttpHead& head, bool keep_alive,
                                            const Jobs& jobs, const std::shared_ptr<Waiter>& waiter,
                                            ResponseFormat& format, const Headers& headers, Exchange& ex) {
  // HTTP/1.1 gets a chunked stream; an HTTP/1.0 client gets the raw events and a close.
  const bool chunked = head.version == 11;
  keep_alive = keep_alive && chunked;
  http::response<http::empty_body> res{http::status::ok, static_cast<unsigned>(head.version)};
  res.set(http::field::server, "dsv4");
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-cache");
  res.set("X-Accel-Buffering", "no");
  for (const auto& [k, v] : headers) res.set(k, v);
  res.keep_alive(keep_alive);
  if (chunked) res.chunked(true);
  http::response_serializer<http::empty_body> serializer(res);
  beast::error_code ec;
  stream.expires_after(options.write_timeout);
  co_await http::async_write_header(stream, serializer, net::redirect_error(use_awaitable, ec));

  auto send = [&](const std::string& bytes) -> awaitable<bool> {
    if (bytes.empty()) co_return true;
    beast::error_code wec;
    stream.expires_after(options.write_timeout);
    if (chunked) {
      auto chunk = http::make_chunk(net::buffer(bytes));
      co_await net::async_write(stream, chunk, net::redirect_error(use_awaitable, wec));
    } else
      co_await net::async_write(stream, net::buffer(bytes), net::redirect_error(use_awaitable, wec));
    co_return !wec;
  };
  auto client_gone = [&]() {
    for (const std::shared_ptr<Job>& j : jobs) scheduler.cancel(j);
    ex.status = kClientClosed;
    record(ex);
    return false;
  };

  const std::string first = format.start();
  if (ec || !co_await send(first)) co_return client_gone();
  watch_peer(stream, waiter);
  auto last_write = Clock::now();
  std::string text;
  for (;;) {
    bool done = true;
    std::string events;
    for (size_t i = 0; i < jobs.size(); ++i) {
      done = jobs[i]->take(text) && done;
      if (!text.empty()) events += format.text(i, text);
      text.clear();
    }
    if (!co_await send(events)) co_return client_gone();
    if (!events.empty()) last_write = Clock::now();
    if (done) break;
    if (waiter->client_gone) co_return client_gone();
    if (Clock::now() - last_write >= kKeepAliveComment) {
      static const std::string kComment = ": keep-alive\n\n";
      if (!co_await send(kComment)) co_return client_gone();
      last_write = Clock::now();
    }
    co_await waiter->wait_until(last_write + kKeepAliveComment);
  }
  stream.socket().cancel(ec);  // ends the peer watch

  // The status the client got: 200 for a stream that ended with [DONE], the error's own
  // status for one that ended with an error event.
  std::string last;
  if (const std::optional<ApiError> e = jobs_error(jobs)) {
    last = format.error(*e);
    ex.status = e->status;
    keep_alive = false;
  } else {
    last = format.end(outcomes_of(jobs));
    ex.status = 200;
  }
  if (!co_await send(last)) co_return client_gone();
  if (chunked) {
    stream.expires_after(options.write_timeout);
    auto last_chunk = http::make_chunk_last();
    co_await net::async_write(stream, last_chunk, net::redirect_error(use_awaitable, ec));
    if (ec) co_return client_gone();
  }
  record(ex);
  co_return keep_alive && !shutting_down;
}

// ---- lifetime ------------------------------------------------------------------------------

void Server::Impl::shutdown_connections() {
  shutting_down = true;
  beast::error_code ec;
  acceptor.close(ec);
  // Connections between requests close now; the others finish their answer first (the
  // scheduler has ended their jobs already).
  for (Connection* c : connections)
    if (c->reading) c->stream->socket().close(ec);
  for (auto& w : body_waiters) w->timer.cancel();
}

Server::Server(Engine& engine, const text::Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(options))) {}

Server::~Server() { stop(); }

int Server::bind() { return impl_->bind(); }

void Server::run() {
  impl_->run_entered = true;
  if (!impl_->stopping) {
    net::co_spawn(impl_->io, impl_->accept_loop(), net::detached);
    impl_->io.run();
  }
  impl_->run_returned = true;
}

void Server::start() {
  std::lock_guard lock(impl_->stop_mu);
  if (!impl_->thread.joinable() && !impl_->stopping) impl_->thread = std::thread([this] { run(); });
}

void Server::stop() {
  std::lock_guard lock(impl_->stop_mu);
  Impl& s = *impl_;
  if (!s.stopping.exchange(true)) {
    // Handlers waiting for generations get their jobs' end (an error event, a 503).
    s.scheduler.stop();
    net::post(s.io, [&s] { s.shutdown_connections(); });
    // Let the answers in progress be written, within a short bound (a client that does not
    // read must not hold the shutdown for a whole write timeout).
    const auto deadline = Clock::now() + std::min<Clock::duration>(s.options.write_timeout, 2s);
    while (s.run_entered && !s.run_returned && s.open_connections > 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    s.io.stop();
  }
  if (s.thread.joinable()) s.thread.join();
  s.parse_pool.stop();
  s.parse_pool.join();
}

Scheduler& Server::scheduler() { return impl_->scheduler; }
Metrics& Server::metrics() { return impl_->metrics; }

}  // namespace dsv4::server
