#include "dsv4/server/anthropic_routes.h"

#include "dsv4/server/anthropic_api.h"
#include "dsv4/server/openai_routes.h"

namespace dsv4::server {
namespace {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Tool call ids: "toolu_<hex>_<i>".
std::string tool_use_prefix(const ResponseHeader& h) { return "toolu_" + h.id.substr(h.id.find('_') + 1) + "_"; }

// disable_parallel_tool_use: the first call only.
void limit_calls(const ApiRequest& r, std::vector<text::chat::ToolCall>& calls) {
  if (!r.tool_choice.parallel && calls.size() > 1) calls.resize(1);
}

class MessagesFormat final : public ResponseFormat {
 public:
  MessagesFormat(const ApiRequest& r, ResponseHeader h, std::shared_ptr<Job> job)
      : request_(r),
        header_(h),
        job_(std::move(job)),
        parser_(answer_parser(r, tool_use_prefix(header_))),
        encoder_(std::move(h), r.thinking) {}

  // message_start waits for the job to start: then its usage can say how much the cache held.
  std::string start() override { return ""; }

  std::string text(const std::string& piece) override { return started() + encoder_.delta(parser_.feed(piece)); }

  std::string end(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    std::string out = started();
    ChatDelta rest = parser_.finish();
    limit_calls(request_, rest.tool_calls);
    const std::string reason = anthropic::stop_reason(g.finish, g.stop_string, !rest.tool_calls.empty());
    return out + encoder_.finish(rest, reason, g.stop_string, anthropic::usage_json(g.stats));
  }

  std::string error(const ApiError& e) override { return anthropic::StreamEncoder::error(e); }

  std::string complete(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    ChatOutputParser parser = answer_parser(request_, tool_use_prefix(header_));
    ChatDelta body = parser.feed(g.text);
    ChatDelta end = parser.finish();
    limit_calls(request_, end.tool_calls);
    ChatAnswer answer{body.reasoning + end.reasoning, body.content + end.content, std::move(end.tool_calls)};
    const std::string reason = anthropic::stop_reason(g.finish, g.stop_string, !answer.tool_calls.empty());
    Json message =
        anthropic::message_json(header_, answer, request_.thinking, reason, g.stop_string, anthropic::usage_json(g.stats));
    message["stats"] = stats_json(g.stats, o.queue_s);
    return dump(message);
  }

 private:
  // message_start and ping, once: the job has started by the time text (or the end) arrives.
  std::string started() {
    if (started_) return "";
    started_ = true;
    GenerationStats usage;
    if (std::optional<JobStart> s = job_ ? job_->started() : std::nullopt) {
      usage.prompt_tokens = s->prompt_tokens;
      usage.reused_tokens = s->reused_tokens;
    }
    return encoder_.start(anthropic::usage_json(usage));
  }

  ApiRequest request_;
  ResponseHeader header_;
  std::shared_ptr<Job> job_;
  ChatOutputParser parser_;
  anthropic::StreamEncoder encoder_;
  bool started_ = false;
};

}  // namespace

std::vector<GenerationRoute> anthropic_routes(const RequestDefaults& defaults, const RequestLimits& limits,
                                              const text::Tokenizer& tokenizer) {
  auto error_body = [](const ApiError& e) { return anthropic::error_body(e); };
  std::vector<GenerationRoute> routes;
  routes.push_back(GenerationRoute{
      "/v1/messages", "msg_", anthropic::messages_request_fields(),
      [defaults, limits](const Json& body) { return anthropic::parse_messages_request(body, defaults, limits); },
      [](const ApiRequest& r, const ResponseHeader& h, const std::shared_ptr<Job>& job)
          -> std::unique_ptr<ResponseFormat> { return std::make_unique<MessagesFormat>(r, h, job); },
      nullptr, error_body});
  routes.push_back(GenerationRoute{
      "/v1/messages/count_tokens", "msg_", anthropic::messages_request_fields(),
      [defaults, limits](const Json& body) { return anthropic::parse_messages_request(body, defaults, limits, true); },
      nullptr,
      [&tokenizer](const ApiRequest& r) { return dump(Json{{"input_tokens", tokenizer.encode(r.prompt_text, r.prompt_caller).size()}}); },
      error_body});
  return routes;
}

}  // namespace dsv4::server
