// libFuzzer target for a request as the server reads it: the HTTP head and framing
// (parse_http_request: Beast's parser plus the server's own rules), then the JSON body through
// the API layer the way the server parses it (only the endpoint's fields are built, within
// the value bound), for the OpenAI endpoints and Anthropic's Messages API. Refusals (ApiError, ApiException) are expected;
// crashes, sanitizer reports and any other exception are bugs.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include "dsv4/server/anthropic_api.h"
#include "dsv4/server/http_request.h"
#include "dsv4/server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsv4::server;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto parsed = parse_http_request(bytes, HttpLimits{16 << 10, 1 << 20});
  if (!std::holds_alternative<ParsedRequest>(parsed)) return 0;
  const ParsedRequest& r = std::get<ParsedRequest>(parsed);
  const std::string path = r.head.path();
  // Any other path still sends its body through a parser: the endpoints take turns.
  int api = r.body.size() % 3;  // 0 chat, 1 completions, 2 messages
  if (path == "/v1/chat/completions") api = 0;
  if (path == "/v1/completions") api = 1;
  if (path.rfind("/v1/messages", 0) == 0) api = 2;
  // Every field given: the defaults' initializers read the settings table, which this
  // parsers-only build does not link.
  const RequestDefaults defaults{.sampling = {}, .seed = std::nullopt, .max_tokens = 512, .stop = {},
                                 .vocab_size = 1000, .spec = dsv4::SpecMode::kAuto, .draft_max = 4};
  RequestLimits limits;
  limits.max_json_values = 4096;
  try {
    const FieldList& fields = api == 0   ? chat_request_fields()
                              : api == 1 ? completion_request_fields()
                                         : anthropic::messages_request_fields();
    const Json body = parse_json_body(r.body, limits, &fields);
    if (api == 0) parse_chat_request(body, defaults, limits);
    else if (api == 1) parse_completion_request(body, defaults, limits);
    else anthropic::parse_messages_request(body, defaults, limits, path == "/v1/messages/count_tokens");
  } catch (const ApiException&) {
  }
  return 0;
}
