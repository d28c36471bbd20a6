#include "dsv4/server/http_request.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include <fmt/format.h>

#include "dsv4/server/beast_request.h"

namespace dsv4::server {
namespace {

namespace http = boost::beast::http;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

ApiError framing_error(int status, std::string message) {
  return ApiError{status, "invalid_request_error", std::move(message), "", "invalid_http_request"};
}

}  // namespace

const std::string* HttpHead::find(std::string_view name) const {
  for (const auto& [k, v] : fields)
    if (iequals(k, name)) return &v;
  return nullptr;
}

size_t HttpHead::count(std::string_view name) const {
  return static_cast<size_t>(std::count_if(fields.begin(), fields.end(), [&](const auto& f) { return iequals(f.first, name); }));
}

std::string HttpHead::value(std::string_view name) const {
  const std::string* v = find(name);
  return v ? *v : std::string();
}

std::string HttpHead::path() const { return target.substr(0, target.find('?')); }

ApiError malformed_request(std::string_view why) {
  return framing_error(400, fmt::format("The HTTP request is malformed: {}.", why));
}

std::optional<ApiError> check_head(const HttpHead& head, BodyFraming& framing) {
  framing = BodyFraming{};
  if (head.version != 10 && head.version != 11)
    return framing_error(505, fmt::format("HTTP/{}.{} is not supported (HTTP/1.0 and HTTP/1.1 are).", head.version / 10,
                                          head.version % 10));
  if (head.target.empty() || head.target[0] != '/')
    return malformed_request("the request target must be a path starting with '/'");
  const size_t hosts = head.count("Host");
  if (hosts > 1) return malformed_request("more than one Host header");
  if (hosts == 0 && head.version == 11) return malformed_request("an HTTP/1.1 request needs a Host header");

  const size_t lengths = head.count("Content-Length");
  const size_t codings = head.count("Transfer-Encoding");
  if (lengths > 1) return malformed_request("more than one Content-Length header");
  if (codings > 1) return malformed_request("more than one Transfer-Encoding header");
  if (lengths && codings) return malformed_request("both Content-Length and Transfer-Encoding");
  if (lengths) {
    const std::string_view v = trim(*head.find("Content-Length"));
    if (v.empty() || v.size() > 19 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return malformed_request(fmt::format("invalid Content-Length '{}'", v.substr(0, 32)));
    framing.content_length = std::stoull(std::string(v));
  }
  if (codings) {
    if (head.version == 10) return malformed_request("Transfer-Encoding in an HTTP/1.0 request");
    std::string v(trim(*head.find("Transfer-Encoding")));
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "chunked") {
      framing.chunked = true;
    } else {
      // RFC 9112 6.3: without chunked last the body's length cannot be known (400); other
      // codings before it are ones this server does not implement (501).
      const size_t last = v.rfind(',');
      const std::string_view final_coding = trim(last == std::string::npos ? std::string_view(v) : std::string_view(v).substr(last + 1));
      if (final_coding != "chunked")
        return malformed_request(fmt::format("Transfer-Encoding '{}' does not end with chunked", v.substr(0, 64)));
      return framing_error(501, fmt::format("Transfer-Encoding '{}' is not supported (only chunked is).", v.substr(0, 64)));
    }
  }
  return std::nullopt;
}

namespace beast_request {

void configure(Parser& parser, const HttpLimits& limits) {
  parser.header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits.max_head_bytes, UINT32_MAX)));
  // The head is read without a body limit, so that a too-large Content-Length is answered
  // with the route's own 413 after the head's checks; set_body_limit comes before the body.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // (Beast 1.74 mishandles boost::none here)
}

void set_body_limit(Parser& parser, const HttpLimits& limits) { parser.body_limit(limits.max_body_bytes); }

HttpHead head_of(const Parser::value_type& request) {
  HttpHead h;
  h.method = std::string(request.method_string());
  h.target = std::string(request.target());
  h.version = static_cast<int>(request.version());
  for (const auto& f : request) h.fields.emplace_back(std::string(f.name_string()), std::string(f.value()));
  return h;
}

ApiError error_for(const boost::beast::error_code& ec) {
  if (ec == http::error::body_limit)
    return ApiError{413, "invalid_request_error", "The request body is too large.", "", "request_too_large"};
  if (ec == http::error::header_limit || ec == boost::beast::error_code(http::error::buffer_overflow))
    return ApiError{431, "invalid_request_error", "The request head (request line and headers) is too large.", "",
                    "request_header_too_large"};
  if (ec == http::error::partial_message || ec == http::error::need_more)
    return malformed_request("the request ends before its body is complete");
  return malformed_request(ec.message());
}

}  // namespace beast_request

std::variant<ParsedRequest, ApiError> parse_http_request(std::string_view bytes, const HttpLimits& limits) {
  beast_request::Parser parser;
  beast_request::configure(parser, limits);
  parser.eager(false);  // stop after the head, to check it before the body
  boost::beast::error_code ec;
  size_t at = 0;
  while (!parser.is_header_done()) {
    const size_t used = parser.put(boost::asio::buffer(bytes.data() + at, bytes.size() - at), ec);
    at += used;
    if (ec == http::error::need_more && at == bytes.size()) return malformed_request("the request head is incomplete");
    if (ec && ec != http::error::need_more) return beast_request::error_for(ec);
    if (used == 0 && !parser.is_header_done()) return malformed_request("the request head is incomplete");
  }
  ParsedRequest out;
  out.head = beast_request::head_of(parser.get());
  if (auto e = check_head(out.head, out.framing)) return *e;
  if (!out.framing.chunked && out.framing.content_length > limits.max_body_bytes)
    return beast_request::error_for(http::error::body_limit);
  beast_request::set_body_limit(parser, limits);
  parser.eager(true);
  while (!parser.is_done()) {
    const size_t used = parser.put(boost::asio::buffer(bytes.data() + at, bytes.size() - at), ec);
    at += used;
    if (ec == http::error::need_more && at == bytes.size()) {
      parser.put_eof(ec);
      if (ec) return beast_request::error_for(ec);
      break;
    }
    if (ec && ec != http::error::need_more) return beast_request::error_for(ec);
    if (used == 0 && !parser.is_done()) {
      parser.put_eof(ec);
      if (ec) return beast_request::error_for(ec);
      break;
    }
  }
  out.body = std::move(parser.get().body());
  return out;
}

}  // namespace dsv4::server
