// The server's request parser (Boost.Beast's, kept out of public headers: it is slow to
// compile) and how its results become HttpHead and errors. Used by http_request.cc and
// http_server.cc only.
#pragma once

#include <boost/beast/http.hpp>

#include "dsv4/server/http_request.h"

namespace dsv4::server::beast_request {

using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// The head's limit (and no body limit yet); set_body_limit before reading the body.
void configure(Parser& parser, const HttpLimits& limits);
void set_body_limit(Parser& parser, const HttpLimits& limits);
HttpHead head_of(const Parser::value_type& request);
// The response to a parse error: 400 malformed, 413 body too large, 431 head too large.
ApiError error_for(const boost::beast::error_code& ec);

}  // namespace dsv4::server::beast_request
