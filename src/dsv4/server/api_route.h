// A generation endpoint as the HTTP layer sees it: a POST path whose JSON body becomes an
// ApiRequest (parse, on a parse thread; it throws ApiException for a bad request), and a
// ResponseFormat that turns the job's outcome (or its stream of text) into the bytes the
// client gets. The HTTP layer does everything else the same way for every endpoint:
// authentication and the queue decision before the body is read, the body's memory bound,
// tokenization, the context check, scheduling, cancellation when the client goes away, and
// honest accounting. Adding an API (another wire format) is a parse function, a format and
// one entry in the server's route list. A route that answers without the engine (Anthropic's
// count_tokens) has `answer_at_once` instead of a format: it takes no place in the queue.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/server/api_error.h"
#include "dsv4/server/openai_api.h"
#include "dsv4/server/scheduler.h"

namespace dsv4::server {

// One response being written, of one job per choice (OpenAI's `n`; one for other requests).
// Streams call start(), text() for each piece of generated text, then end() or error(); a
// non-streamed answer calls complete().
class ResponseFormat {
 public:
  virtual ~ResponseFormat() = default;
  // Server-sent events: what goes out before any text (may be "").
  virtual std::string start() = 0;
  // Events for newly generated text of a choice (may be "": e.g. text held back as a possible
  // tool call).
  virtual std::string text(size_t choice, const std::string& piece) = 0;
  // The last events once every choice finished (each outcome's status is kDone), ending the stream.
  virtual std::string end(std::span<const JobOutcome* const> outcomes) = 0;
  // A late error ends the stream with this event instead (headers, 200, are gone already).
  virtual std::string error(const ApiError& e) = 0;
  // The whole JSON response of finished, non-streamed choices.
  virtual std::string complete(std::span<const JobOutcome* const> outcomes) = 0;
};

using Jobs = std::vector<std::shared_ptr<Job>>;

struct GenerationRoute {
  std::string path;       // e.g. "/v1/chat/completions"
  std::string id_prefix;  // response ids are "<prefix><16 hex digits>" ("chatcmpl-", "msg_")
  FieldList fields;       // top-level body fields `parse` reads; others are skipped unbuilt
  std::function<ApiRequest(const Json& body)> parse;
  // The response of queued jobs, one per choice (the format may read their log-probabilities and start).
  std::function<std::unique_ptr<ResponseFormat>(const ApiRequest&, const ResponseHeader&, const Jobs&)> format;
  // Set for a route that answers from the parsed request alone: the JSON response.
  std::function<std::string(const ApiRequest&)> answer_at_once;
  // The JSON of an error response (default: OpenAI's shape, ApiError::body()).
  std::function<std::string(const ApiError&)> error_body;
};

}  // namespace dsv4::server
