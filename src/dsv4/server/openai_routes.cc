#include "dsv4/server/openai_routes.h"

#include "dsv4/server/chat_output.h"

namespace dsv4::server {
namespace {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string tool_call_prefix(const ResponseHeader& h) { return "call_" + h.id.substr(h.id.find('-') + 1) + "_"; }

class ChatFormat final : public ResponseFormat {
 public:
  ChatFormat(const ApiRequest& r, ResponseHeader h)
      : request_(r), header_(std::move(h)), parser_(r.thinking, r.tools, tool_call_prefix(header_)) {}

  std::string start() override { return sse_event(chat_chunk_json(header_, {{"role", "assistant"}, {"content", ""}}, "")); }

  std::string text(const std::string& piece) override { return delta_events(parser_.feed(piece)); }

  std::string end(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    std::string out = delta_events(parser_.finish());
    Json last = chat_chunk_json(header_, Json::object(), finish_reason_text(g.finish, tool_calls_sent_));
    last["stats"] = stats_json(g.stats, o.queue_s);
    out += sse_event(last);
    if (request_.include_usage)
      out += sse_event(usage_chunk_json(ApiKind::kChat, header_, usage_json(g.stats), stats_json(g.stats, o.queue_s)));
    return out + "data: [DONE]\n\n";
  }

  std::string error(const ApiError& e) override { return "data: " + e.body() + "\n\n"; }

  std::string complete(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    ChatOutputParser parser(request_.thinking, request_.tools, tool_call_prefix(header_));
    ChatDelta body = parser.feed(g.text);
    ChatDelta end = parser.finish();
    ChatAnswer answer{body.reasoning + end.reasoning, body.content + end.content, std::move(end.tool_calls)};
    const std::string finish = finish_reason_text(g.finish, !answer.tool_calls.empty());
    return dump(chat_completion_json(header_, answer, request_.thinking, finish, usage_json(g.stats),
                                     stats_json(g.stats, o.queue_s)));
  }

 private:
  std::string delta_events(const ChatDelta& d) {
    std::string out;
    if (!d.reasoning.empty()) out += sse_event(chat_chunk_json(header_, {{"reasoning_content", d.reasoning}}, ""));
    if (!d.content.empty()) out += sse_event(chat_chunk_json(header_, {{"content", d.content}}, ""));
    if (!d.tool_calls.empty()) {
      tool_calls_sent_ = true;
      out += sse_event(chat_chunk_json(header_, {{"tool_calls", tool_calls_json(d.tool_calls, true)}}, ""));
    }
    return out;
  }

  ApiRequest request_;
  ResponseHeader header_;
  ChatOutputParser parser_;
  bool tool_calls_sent_ = false;
};

class CompletionFormat final : public ResponseFormat {
 public:
  CompletionFormat(const ApiRequest& r, ResponseHeader h) : include_usage_(r.include_usage), header_(std::move(h)) {}

  std::string start() override { return ""; }
  std::string text(const std::string& piece) override { return sse_event(completion_chunk_json(header_, piece, "")); }
  std::string end(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    Json last = completion_chunk_json(header_, "", finish_reason_text(g.finish, false));
    last["stats"] = stats_json(g.stats, o.queue_s);
    std::string out = sse_event(last);
    if (include_usage_)
      out += sse_event(usage_chunk_json(ApiKind::kCompletion, header_, usage_json(g.stats), stats_json(g.stats, o.queue_s)));
    return out + "data: [DONE]\n\n";
  }
  std::string error(const ApiError& e) override { return "data: " + e.body() + "\n\n"; }
  std::string complete(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    return dump(completion_json(header_, g.text, finish_reason_text(g.finish, false), usage_json(g.stats),
                                stats_json(g.stats, o.queue_s)));
  }

 private:
  bool include_usage_;
  ResponseHeader header_;
};

}  // namespace

std::vector<GenerationRoute> openai_routes(const RequestDefaults& defaults, const RequestLimits& limits) {
  auto error_body = [](const ApiError& e) { return e.body(); };
  std::vector<GenerationRoute> routes;
  routes.push_back(GenerationRoute{
      "/v1/chat/completions", "chatcmpl", chat_request_fields(),
      [defaults, limits](const Json& body) { return parse_chat_request(body, defaults, limits); },
      [](const ApiRequest& r, const ResponseHeader& h) -> std::unique_ptr<ResponseFormat> {
        return std::make_unique<ChatFormat>(r, h);
      },
      error_body});
  routes.push_back(GenerationRoute{
      "/v1/completions", "cmpl", completion_request_fields(),
      [defaults, limits](const Json& body) { return parse_completion_request(body, defaults, limits); },
      [](const ApiRequest& r, const ResponseHeader& h) -> std::unique_ptr<ResponseFormat> {
        return std::make_unique<CompletionFormat>(r, h);
      },
      error_body});
  return routes;
}

}  // namespace dsv4::server
