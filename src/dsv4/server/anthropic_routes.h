// The Anthropic Messages API as GenerationRoutes: POST /v1/messages (a JSON message or
// Anthropic's event stream, see anthropic_api.h) and POST /v1/messages/count_tokens (answered
// from the request alone: it takes no place in the queue, so the dozens a Claude-style client
// sends at start-up cost a parse and a tokenization each). Errors in Anthropic's shape.
#pragma once

#include <vector>

#include "dsv4/server/api_route.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::server {

// The tokenizer must outlive the routes.
std::vector<GenerationRoute> anthropic_routes(const RequestDefaults& defaults, const RequestLimits& limits,
                                              const text::Tokenizer& tokenizer);

}  // namespace dsv4::server
