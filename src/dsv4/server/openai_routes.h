// The OpenAI endpoints as GenerationRoutes: POST /v1/chat/completions and POST
// /v1/completions, with their JSON responses and server-sent event streams (every stream ends
// with "data: [DONE]", or with one "data: {"error": ...}" event when the generation failed or
// the server shut down after the stream began).
#pragma once

#include <vector>

#include "dsv4/server/api_route.h"

namespace dsv4::server {

std::vector<GenerationRoute> openai_routes(const RequestDefaults& defaults, const RequestLimits& limits);

}  // namespace dsv4::server
