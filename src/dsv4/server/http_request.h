// One HTTP/1.x request as the server sees it, and the framing rules it must pass before any of
// its body is read. The wire parser (Boost.Beast's) already refuses conflicting, negative or
// oversized Content-Length values and Content-Length together with Transfer-Encoding; on top of
// that a request here must have exactly one Host header (HTTP/1.1), at most one Content-Length
// made only of digits, and a Transfer-Encoding that is exactly "chunked". Ranges are not a
// thing this server does: a Range header is ignored everywhere.
//
// parse_http_request runs the same parser and rules over a byte string: the fuzz target and
// the framing tests use it; the server applies check_head to each head it reads off a socket.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "dsv4/server/api_error.h"

namespace dsv4::server {

struct HttpHead {
  std::string method;  // as sent ("GET", "POST", ...)
  std::string target;  // the request-target, e.g. "/v1/models?x=1"
  int version = 11;    // 10 or 11
  std::vector<std::pair<std::string, std::string>> fields;  // in order, names as sent

  // The first field with this name (case-insensitive), or null.
  const std::string* find(std::string_view name) const;
  size_t count(std::string_view name) const;
  std::string value(std::string_view name) const;  // "" when absent
  std::string path() const;                         // the target without its query
};

// How the body of a request that passed check_head is delimited.
struct BodyFraming {
  bool chunked = false;
  uint64_t content_length = 0;  // when not chunked (0: no body)
  bool has_body() const { return chunked || content_length > 0; }
};

// 400 (or 501 for a transfer coding other than chunked) when the head breaks the rules above.
std::optional<ApiError> check_head(const HttpHead& head, BodyFraming& framing);

struct HttpLimits {
  size_t max_head_bytes = 16 << 10;  // request line + fields
  size_t max_body_bytes = 16 << 20;
};

struct ParsedRequest {
  HttpHead head;
  BodyFraming framing;
  std::string body;
};

// One complete request at the start of `bytes`: the request, or the error the server answers
// with (400 malformed, 413 body too large, 431 head too large, 501 unknown transfer coding).
// Bytes that end before the request does are a 400 ("incomplete").
std::variant<ParsedRequest, ApiError> parse_http_request(std::string_view bytes, const HttpLimits& limits = {});

// "The HTTP request is malformed: <why>." (400, Connection: close).
ApiError malformed_request(std::string_view why);

}  // namespace dsv4::server
