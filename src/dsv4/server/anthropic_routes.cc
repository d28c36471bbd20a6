#include "dsv4/server/anthropic_routes.h"

#include "dsv4/server/anthropic_api.h"
#include "dsv4/server/openai_routes.h"

namespace dsv4::server {
namespace {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Tool call ids: "toolu_<hex>_<i>".
std::string tool_use_prefix(const ResponseHeader& h) { return "toolu_" + h.id.substr(h.id.find('_') + 1) + "_"; }

// disable_parallel_tool_use: the first call only (a complete one, when a later call was cut).
void limit_calls(const ApiRequest& r, ChatDelta& d) {
  if (r.tool_choice.parallel || d.tool_calls.size() <= 1) return;
  d.tool_calls.resize(1);
  d.cut_call = false;
  d.cut_input = nullptr;
}

class MessagesFormat final : public ResponseFormat {
 public:
  MessagesFormat(const ApiRequest& r, ResponseHeader h, const Jobs& jobs)
      : request_(r),
        header_(h),
        job_(jobs.front()),
        parser_(answer_parser(r, tool_use_prefix(header_))),
        encoder_(std::move(h), r.thinking) {}

  // message_start waits for the job to start: then its usage can say how much the cache held.
  std::string start() override { return ""; }

  // One choice: the Messages API has no `n`.
  std::string text(size_t, const std::string& piece) override { return started() + encoder_.delta(parser_.feed(piece)); }

  std::string end(std::span<const JobOutcome* const> outcomes) override {
    const GenerationResult& g = outcomes.front()->result;
    std::string out = started();
    ChatDelta rest = parser_.finish(cut_short(g));
    limit_calls(request_, rest);
    const std::string reason = anthropic::stop_reason(g.finish, g.stop_string, !rest.tool_calls.empty() && !rest.cut_call);
    return out + encoder_.finish(rest, reason, g.stop_string, anthropic::usage_json(g.stats));
  }

  std::string error(const ApiError& e) override { return anthropic::StreamEncoder::error(e); }

  std::string complete(std::span<const JobOutcome* const> outcomes) override {
    const JobOutcome& o = *outcomes.front();
    const GenerationResult& g = o.result;
    ChatOutputParser parser = answer_parser(request_, tool_use_prefix(header_));
    ChatDelta body = parser.feed(g.text);
    ChatDelta end = parser.finish(cut_short(g));
    limit_calls(request_, end);
    ChatAnswer answer{body.reasoning + end.reasoning, body.content + end.content, std::move(end.tool_calls),
                      end.cut_call, std::move(end.cut_input)};
    // A cut tool_use is returned as written so far, under the reason it was cut ("max_tokens").
    const std::string reason =
        anthropic::stop_reason(g.finish, g.stop_string, !answer.tool_calls.empty() && !answer.cut_call);
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
      [](const ApiRequest& r, const ResponseHeader& h, const Jobs& jobs)
          -> std::unique_ptr<ResponseFormat> { return std::make_unique<MessagesFormat>(r, h, jobs); },
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
