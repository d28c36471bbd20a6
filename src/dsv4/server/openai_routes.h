// The OpenAI endpoints as GenerationRoutes: POST /v1/chat/completions and POST
// /v1/completions, with their JSON responses and server-sent event streams (every stream ends
// with "data: [DONE]", or with one "data: {"error": ...}" event when the generation failed or
// the server shut down after the stream began).
#pragma once

#include <vector>

#include "dsv4/server/api_route.h"
#include "dsv4/server/chat_output.h"
#include "dsv4/text/tokenizer.h"

namespace dsv4::server {

// The tokenizer (for log-probabilities' token texts) must outlive the routes.
std::vector<GenerationRoute> openai_routes(const RequestDefaults& defaults, const RequestLimits& limits,
                                           const text::Tokenizer& tokenizer);

// The answer parser of a chat or messages request; tool call ids are id_prefix + index.
ChatOutputParser answer_parser(const ApiRequest& r, const std::string& id_prefix);

// The answer did not end on its own (max_tokens, the context limit, a stop string): a tool
// call still being written is a cut call (ChatOutputParser::finish).
bool cut_short(const GenerationResult& g);

}  // namespace dsv4::server
