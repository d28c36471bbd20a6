// The HTTP layer against what a hostile or broken client sends (all on loopback, each test
// bounded to a few seconds): strict framing (each bad case gets its 400 at once, over a real
// socket and through parse_http_request), Range ignored, admission and authentication before
// the body is read, deadlines for the head and the body, the connection cap, /health while
// a hundred slow clients hold connections, and the status that logs and metrics count for
// streams that errored or whose client left.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dsv4/server/http_request.h"
#include "server_harness.h"

namespace dsv4::server {
namespace {

using namespace test_server;
using Ms = std::chrono::milliseconds;

Ms since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - t);
}

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

std::string metrics_text(const TestServer& s) { return get(s, "/metrics").body; }

struct FramingCase {
  const char* name;
  std::string request;
  int status;
};

std::vector<FramingCase> framing_cases() {
  const std::string body = R"({"model":"tiny-a","prompt":"x","max_tokens":1})";
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const std::string len = std::to_string(body.size());
  return {
      {"two conflicting Content-Length", post + "Content-Length: " + len + "\r\nContent-Length: 3\r\n\r\n" + body, 400},
      {"two equal Content-Length", post + "Content-Length: " + len + "\r\nContent-Length: " + len + "\r\n\r\n" + body, 400},
      {"a Content-Length list", post + "Content-Length: " + len + ", " + len + "\r\n\r\n" + body, 400},
      {"Content-Length and chunked", post + "Content-Length: " + len + "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
      {"chunked and Content-Length", post + "Transfer-Encoding: chunked\r\nContent-Length: " + len + "\r\n\r\n0\r\n\r\n", 400},
      {"negative Content-Length", post + "Content-Length: -1\r\n\r\n", 400},
      {"signed Content-Length", post + "Content-Length: +5\r\n\r\n", 400},
      {"huge Content-Length", post + "Content-Length: 99999999999999999999999\r\n\r\n", 400},
      {"Transfer-Encoding without chunked", post + "Transfer-Encoding: gzip\r\n\r\n", 400},
      {"chunked not last", post + "Transfer-Encoding: chunked, gzip\r\n\r\n", 400},
      {"another coding before chunked", post + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
      {"HTTP/1.1 without Host", "GET /health HTTP/1.1\r\n\r\n", 400},
      {"two Host headers", "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: localhost\r\n\r\n", 400},
      {"space before the colon", "GET /health HTTP/1.1\r\nHost : 127.0.0.1\r\n\r\n", 400},
      {"not HTTP/1.x", "GET /health HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", 400},
      {"a target that is not a path", "GET health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400},
      {"a bad chunk size", post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
  };
}

TEST(HttpFraming, ParseHttpRequestRefusesEachAmbiguousHead) {
  for (const FramingCase& c : framing_cases()) {
    auto r = parse_http_request(c.request);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << c.name;
    EXPECT_EQ(std::get<ApiError>(r).status, c.status) << c.name << ": " << std::get<ApiError>(r).message;
  }
  // And what is fine passes: a chunked body, HTTP/1.0 without Host, a body cut at its length.
  auto chunked = parse_http_request(
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(chunked));
  EXPECT_EQ(std::get<ParsedRequest>(chunked).body, "abcde");
  EXPECT_TRUE(std::get<ParsedRequest>(chunked).framing.chunked);
  auto old = parse_http_request("GET /health HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(old));
  EXPECT_EQ(std::get<ParsedRequest>(old).head.path(), "/health");
  auto sized = parse_http_request("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcdef");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(sized));
  EXPECT_EQ(std::get<ParsedRequest>(sized).body, "abc");
  // Limits: the body by its declared length (before any of it is read), the head by size.
  auto big = parse_http_request("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n", HttpLimits{1024, 10});
  ASSERT_TRUE(std::holds_alternative<ApiError>(big));
  EXPECT_EQ(std::get<ApiError>(big).status, 413);
  auto fat = parse_http_request("GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(4096, 'x') + "\r\n\r\n", HttpLimits{1024, 10});
  ASSERT_TRUE(std::holds_alternative<ApiError>(fat));
  EXPECT_EQ(std::get<ApiError>(fat).status, 431);
  auto cut = parse_http_request("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc");
  ASSERT_TRUE(std::holds_alternative<ApiError>(cut));
  EXPECT_EQ(std::get<ApiError>(cut).status, 400);
}

TEST(HttpFraming, EachBadHeadGetsItsErrorAtOnceAndTheConnectionCloses) {
  ServerOptions o = test_options();
  o.head_timeout = 5s;  // "at once" is well under this
  TestServer s(o);
  for (const FramingCase& c : framing_cases()) {
    RawConnection conn(s.port());
    const auto start = std::chrono::steady_clock::now();
    conn.send_raw(c.request);
    const std::string response = conn.read_to_close(3s);
    EXPECT_EQ(status_of(response), c.status) << c.name << ": " << response.substr(0, 200);
    EXPECT_TRUE(conn.closed()) << c.name;
    EXPECT_LT(since(start), 1000ms) << c.name;
    EXPECT_NE(response.find("\"error\""), std::string::npos) << c.name;
  }
  EXPECT_EQ(post(s, "/v1/chat/completions", user_chat("Hi", 2)).status, 200);
}

TEST(HttpFraming, RangeIsIgnored) {
  TestServer s;
  for (const char* range : {"bytes=0-1", "bytes=0-1,3-4", "bytes=99999-"}) {
    Reply r = get(s, "/health", {{"Range", range}});
    EXPECT_EQ(r.status, 200) << range;
    EXPECT_EQ(r.json["status"], "ok") << range << ": " << r.body;
    EXPECT_EQ(r.headers.count("Content-Range"), 0u) << range;
  }
  Reply page = get(s, "/", {{"Range", "bytes=0-10"}});
  EXPECT_EQ(page.status, 200);
  EXPECT_GT(page.body.size(), 11u);
}

// ---- admission and authentication before the body -----------------------------------------------

// A POST head announcing a body, without the body.
std::string head_only(const std::string& path, size_t length, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(length) + "\r\n" + extra + "\r\n";
}

TEST(HttpAdmission, FullQueueAndBadKeyAreAnsweredBeforeTheBody) {
  ServerOptions o = test_options();
  o.scheduler.max_queue = 0;  // one generation runs, nothing waits
  o.api_key = "sesame";
  TestServer s(o);
  RawConnection blocker(s.port());
  blocker.send_raw(head_only("/v1/chat/completions", endless(true).dump().size(), "Authorization: Bearer sesame\r\n") +
                   endless(true).dump());
  ASSERT_TRUE(wait_until([&] { return s.server().scheduler().gauges().running; }, 30s));

  // 1 MB announced, nothing sent: the answer comes anyway.
  RawConnection full(s.port());
  full.send_raw(head_only("/v1/chat/completions", 1 << 20, "Authorization: Bearer sesame\r\n"));
  std::string r = full.read_until("\r\n\r\n", 2s);
  EXPECT_EQ(status_of(r), 429) << r;
  EXPECT_NE(r.find("Retry-After: "), std::string::npos);

  RawConnection no_key(s.port());
  no_key.send_raw(head_only("/v1/chat/completions", 1 << 20));
  r = no_key.read_until("\r\n\r\n", 2s);
  EXPECT_EQ(status_of(r), 401) << r;

  // With Expect: 100-continue, a client that would be refused never sends its body.
  RawConnection expect(s.port());
  expect.send_raw(head_only("/v1/chat/completions", 1 << 20, "Authorization: Bearer sesame\r\nExpect: 100-continue\r\n"));
  r = expect.read_until("\r\n\r\n", 2s);
  EXPECT_EQ(status_of(r), 429) << r;
  blocker.close();
}

TEST(HttpAdmission, ABodyOverTheLimitGetsIts413WhileTheClientIsStillSendingIt) {
  // The 413 is decided from the head; the server must read what the client keeps sending
  // before it closes, or the client's write meets a reset and it never sees the answer.
  TestServer s;  // max_body_bytes = 1 MiB
  const std::string body = "{\"model\":\"" + std::string(3 << 20, 'a') + "\"}";
  for (int i = 0; i < 8; ++i) {
    httplib::Client cli = s.client();
    httplib::Result res = cli.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(res) << "try " << i << ": no response (" << httplib::to_string(res.error()) << ")";
    EXPECT_EQ(res->status, 413) << res->body;
  }
  EXPECT_EQ(get(s, "/health").status, 200);
}

TEST(HttpAdmission, UnknownFieldsAreSkippedNotBuilt) {
  // Far more JSON values than the bound allows, all in a field the API does not read.
  std::string junk = "[";
  for (int i = 0; i < 100000; ++i) junk += "{\"a\":1},";
  junk += "0]";
  RequestLimits limits;
  limits.max_json_values = 1000;
  const std::string body = R"({"model":"tiny-a","messages":[{"role":"user","content":"hi"}],"junk":)" + junk + "}";
  const Json j = parse_json_body(body, limits, &chat_request_fields());
  EXPECT_FALSE(j.contains("junk"));
  EXPECT_EQ(j["messages"][0]["content"], "hi");
  // The same values in a field it reads hit the bound: a clear 400.
  const std::string read = R"({"model":"tiny-a","stop":)" + junk + "}";
  try {
    parse_json_body(read, limits, &chat_request_fields());
    ADD_FAILURE() << "no error";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_NE(e.error().message.find("more than 1000 values"), std::string::npos) << e.error().message;
  }
  // Malformed JSON inside a skipped field is still a syntax error.
  EXPECT_THROW(parse_json_body(R"({"model":"tiny-a","junk":[1,,2]})", limits, &chat_request_fields()), ApiException);
}

TEST(HttpAdmission, TheParsersReadOnlyTheirListedFields) {
  RequestDefaults d;
  d.vocab_size = 100;
  // Every listed field parses (an unlisted read would throw std::logic_error).
  EXPECT_NO_THROW(parse_chat_request(Json{{"model", "m"}, {"messages", Json::array({{{"role", "user"}, {"content", "x"}}})}}, d));
  EXPECT_NO_THROW(parse_completion_request(Json{{"model", "m"}, {"prompt", "x"}}, d));
}

// ---- deadlines and the connection cap -------------------------------------------------------------

TEST(HttpDeadlines, HeadAndBodyMustArriveInTime) {
  ServerOptions o = test_options();
  o.head_timeout = 600ms;
  o.body_timeout = 600ms;
  TestServer s(o);
  // A head that trickles in: closed at the deadline although bytes keep coming.
  RawConnection slow(s.port());
  const auto start = std::chrono::steady_clock::now();
  const std::string head = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  for (size_t i = 0; i < head.size() && since(start) < 3s; ++i) {
    if (::send(slow.fd(), head.data() + i, 1, MSG_NOSIGNAL) != 1) break;
    std::this_thread::sleep_for(50ms);
  }
  slow.read_to_close(3s);
  EXPECT_TRUE(slow.closed());
  EXPECT_LT(since(start), 2000ms);
  // A body that stops half-way.
  RawConnection stall(s.port());
  stall.send_raw(head_only("/v1/completions", 100) + "{\"model\":");
  const auto body_start = std::chrono::steady_clock::now();
  stall.read_to_close(3s);
  EXPECT_TRUE(stall.closed());
  EXPECT_LT(since(body_start), 2000ms);
  const std::string m = metrics_text(s);
  EXPECT_NE(m.find("endpoint=\"other\",status=\"408\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("endpoint=\"/v1/completions\",status=\"408\"} 1"), std::string::npos) << m;
}

TEST(HttpDeadlines, ExcessConnectionsAreRefusedCheaply) {
  ServerOptions o = test_options();
  o.max_connections = 8;
  TestServer s(o);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(std::make_unique<RawConnection>(s.port()));
  std::this_thread::sleep_for(200ms);  // all eight accepted
  RawConnection extra(s.port());
  const std::string r = extra.read_to_close(2s);
  EXPECT_EQ(status_of(r), 503) << r;
  EXPECT_NE(r.find("too_many_connections"), std::string::npos);
  idle.clear();  // room again
  ASSERT_TRUE(wait_until([&] { return get(s, "/health").status == 200; }, 2s));
  // At least the one above (probes made while the idle ones were closing may count too).
  const std::string m = metrics_text(s);
  const size_t at = m.find("\ndsv4_connections_refused_total ");
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GE(std::stoi(m.substr(at + 32)), 1);
}

TEST(HttpDeadlines, HealthAnswersWithinAHundredMillisecondsWhileAHundredClientsTrickle) {
  ServerOptions o = test_options();
  o.head_timeout = 4s;
  TestServer s(o);
  constexpr int kSlow = 100;
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < kSlow; ++i) slow.push_back(std::make_unique<RawConnection>(s.port()));
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    const std::string head = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for (size_t i = 0; i < head.size() && !done; ++i) {
      for (auto& c : slow) ::send(c->fd(), head.data() + i, 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(300ms);  // every slow client is mid-head
  Ms worst{0};
  for (int i = 0; i < 10; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Reply h = get(s, "/health");
    worst = std::max(worst, since(start));
    EXPECT_EQ(h.status, 200);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LT(worst, 100ms);
  Reply answer = post(s, "/v1/chat/completions", user_chat("Hi", 2));
  EXPECT_EQ(answer.status, 200);
  done = true;
  trickle.join();
}

// ---- honest accounting ------------------------------------------------------------------------------

TEST(HttpAccounting, StreamsAreCountedUnderWhatTheClientGot) {
  ServerOptions o = test_options();
  o.defaults.vocab_size = 1 << 30;  // an out-of-vocabulary id reaches the engine and fails there
  TestServer s(o);
  // An errored stream: 200 headers, then an error event; counted as 500.
  Json bad = {{"model", "tiny-a"}, {"prompt", Json::array({1, 2, 100000})}, {"max_tokens", 2}, {"stream", true}};
  Reply sr = post(s, "/v1/completions", bad);
  EXPECT_EQ(sr.status, 200);
  std::vector<Json> events = sse_events(sr.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["error"]["type"], "server_error");
  // A stream whose client left: 499, and the engine stops.
  {
    RawConnection c(s.port());
    c.send_request("/v1/chat/completions", endless(true).dump());
    c.read_until("\"content\":\"");
    ASSERT_TRUE(wait_until([&] { return s.server().scheduler().gauges().running; }, 30s));
  }
  ASSERT_TRUE(wait_until([&] { return !s.server().scheduler().gauges().running; }, 2s));
  // A finished stream ends with [DONE] and counts 200.
  Json fine = user_chat("Hi", 2);
  fine["stream"] = true;
  Reply ok = post(s, "/v1/chat/completions", fine);
  ASSERT_FALSE(sse_events(ok.body).empty());
  EXPECT_EQ(sse_events(ok.body).back(), "[DONE]");
  std::string m;
  ASSERT_TRUE(wait_until([&] {
    m = metrics_text(s);
    return m.find("endpoint=\"/v1/chat/completions\",status=\"499\"} 1") != std::string::npos;
  }, 2s)) << m;
  EXPECT_NE(m.find("endpoint=\"/v1/completions\",status=\"500\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("endpoint=\"/v1/chat/completions\",status=\"200\"} 1"), std::string::npos) << m;
  EXPECT_EQ(m.find("endpoint=\"/v1/completions\",status=\"200\""), std::string::npos) << m;
}

}  // namespace
}  // namespace dsv4::server
