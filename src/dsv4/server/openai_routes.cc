#include "dsv4/server/openai_routes.h"

#include "dsv4/server/chat_output.h"

namespace dsv4::server {
namespace {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string tool_call_prefix(const ResponseHeader& h) { return "call_" + h.id.substr(h.id.find('-') + 1) + "_"; }

// The log-probabilities a stream has received but not sent yet (when the request asked for them).
class PendingLogprobs {
 public:
  PendingLogprobs(const ApiRequest& r, std::shared_ptr<Job> job, const text::Tokenizer& tokenizer)
      : wanted_(r.top_logprobs >= 0), job_(std::move(job)), tokenizer_(tokenizer) {}
  // The entries received since the last call, in the chat or completions shape (null: none).
  Json take(bool chat) {
    if (!wanted_ || !job_) return nullptr;
    for (TokenLogprob& lp : job_->take_logprobs()) pending_.push_back(std::move(lp));
    if (pending_.empty()) return nullptr;
    Json j = chat ? chat_logprobs_json(pending_, tokenizer_) : completion_logprobs_json(pending_, tokenizer_);
    pending_.clear();
    return j;
  }

 private:
  bool wanted_;
  std::shared_ptr<Job> job_;
  const text::Tokenizer& tokenizer_;
  std::vector<TokenLogprob> pending_;
};

class ChatFormat final : public ResponseFormat {
 public:
  ChatFormat(const ApiRequest& r, ResponseHeader h, std::shared_ptr<Job> job, const text::Tokenizer& tokenizer)
      : request_(r),
        header_(std::move(h)),
        parser_(answer_parser(r, tool_call_prefix(header_))),
        logprobs_(r, std::move(job), tokenizer),
        tokenizer_(tokenizer) {}

  std::string start() override { return sse_event(chat_chunk_json(header_, {{"role", "assistant"}, {"content", ""}}, "")); }

  std::string text(const std::string& piece) override { return delta_events(parser_.feed(piece)); }

  std::string end(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    std::string out = delta_events(parser_.finish());
    Json last = chat_chunk_json(header_, Json::object(), finish_reason_text(g.finish, tool_calls_sent_),
                                logprobs_.take(true));
    last["stats"] = stats_json(g.stats, o.queue_s);
    out += sse_event(last);
    if (request_.include_usage)
      out += sse_event(usage_chunk_json(ApiKind::kChat, header_, usage_json(g.stats), stats_json(g.stats, o.queue_s)));
    return out + "data: [DONE]\n\n";
  }

  std::string error(const ApiError& e) override { return "data: " + e.body() + "\n\n"; }

  std::string complete(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    ChatOutputParser parser = answer_parser(request_, tool_call_prefix(header_));
    ChatDelta body = parser.feed(g.text);
    ChatDelta end = parser.finish();
    ChatAnswer answer{body.reasoning + end.reasoning, body.content + end.content, std::move(end.tool_calls)};
    const std::string finish = finish_reason_text(g.finish, !answer.tool_calls.empty());
    return dump(chat_completion_json(header_, answer, request_.thinking, finish, usage_json(g.stats),
                                     stats_json(g.stats, o.queue_s),
                                     request_.top_logprobs >= 0 ? chat_logprobs_json(g.logprobs, tokenizer_) : Json()));
  }

 private:
  // Log-probabilities go with the first chunk after they arrive.
  std::string delta_events(const ChatDelta& d) {
    std::string out;
    if (!d.reasoning.empty())
      out += sse_event(chat_chunk_json(header_, {{"reasoning_content", d.reasoning}}, "", logprobs_.take(true)));
    if (!d.content.empty()) out += sse_event(chat_chunk_json(header_, {{"content", d.content}}, "", logprobs_.take(true)));
    if (!d.tool_calls.empty()) {
      tool_calls_sent_ = true;
      out += sse_event(chat_chunk_json(header_, {{"tool_calls", tool_calls_json(d.tool_calls, true)}}, ""));
    }
    return out;
  }

  ApiRequest request_;
  ResponseHeader header_;
  ChatOutputParser parser_;
  PendingLogprobs logprobs_;
  const text::Tokenizer& tokenizer_;
  bool tool_calls_sent_ = false;
};

class CompletionFormat final : public ResponseFormat {
 public:
  CompletionFormat(const ApiRequest& r, ResponseHeader h, std::shared_ptr<Job> job, const text::Tokenizer& tokenizer)
      : include_usage_(r.include_usage),
        with_logprobs_(r.top_logprobs >= 0),
        header_(std::move(h)),
        logprobs_(r, std::move(job), tokenizer),
        tokenizer_(tokenizer) {}

  std::string start() override { return ""; }
  std::string text(const std::string& piece) override {
    return sse_event(completion_chunk_json(header_, piece, "", logprobs_.take(false)));
  }
  std::string end(const JobOutcome& o) override {
    const GenerationResult& g = o.result;
    Json last = completion_chunk_json(header_, "", finish_reason_text(g.finish, false), logprobs_.take(false));
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
                                stats_json(g.stats, o.queue_s),
                                with_logprobs_ ? completion_logprobs_json(g.logprobs, tokenizer_) : Json()));
  }

 private:
  bool include_usage_, with_logprobs_;
  ResponseHeader header_;
  PendingLogprobs logprobs_;
  const text::Tokenizer& tokenizer_;
};

}  // namespace

ChatOutputParser answer_parser(const ApiRequest& r, const std::string& id_prefix) {
  return ChatOutputParser(r.thinking, r.tools, id_prefix);
}

std::vector<GenerationRoute> openai_routes(const RequestDefaults& defaults, const RequestLimits& limits,
                                           const text::Tokenizer& tokenizer) {
  auto error_body = [](const ApiError& e) { return e.body(); };
  std::vector<GenerationRoute> routes;
  routes.push_back(GenerationRoute{
      "/v1/chat/completions", "chatcmpl-", chat_request_fields(),
      [defaults, limits](const Json& body) { return parse_chat_request(body, defaults, limits); },
      [&tokenizer](const ApiRequest& r, const ResponseHeader& h, const std::shared_ptr<Job>& job)
          -> std::unique_ptr<ResponseFormat> { return std::make_unique<ChatFormat>(r, h, job, tokenizer); },
      nullptr, error_body});
  routes.push_back(GenerationRoute{
      "/v1/completions", "cmpl-", completion_request_fields(),
      [defaults, limits](const Json& body) { return parse_completion_request(body, defaults, limits); },
      [&tokenizer](const ApiRequest& r, const ResponseHeader& h, const std::shared_ptr<Job>& job)
          -> std::unique_ptr<ResponseFormat> { return std::make_unique<CompletionFormat>(r, h, job, tokenizer); },
      nullptr, error_body});
  return routes;
}

}  // namespace dsv4::server
