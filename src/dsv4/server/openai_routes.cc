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

// The outcomes' stats, for usage.
std::vector<const GenerationStats*> stats_of(std::span<const JobOutcome* const> outcomes) {
  std::vector<const GenerationStats*> out;
  for (const JobOutcome* o : outcomes) out.push_back(&o->result.stats);
  return out;
}

class ChatFormat final : public ResponseFormat {
 public:
  ChatFormat(const ApiRequest& r, ResponseHeader h, const Jobs& jobs, const text::Tokenizer& tokenizer)
      : request_(r), header_(std::move(h)), tokenizer_(tokenizer) {
    for (const std::shared_ptr<Job>& job : jobs)
      choices_.push_back(Choice{answer_parser(r, call_prefix(choices_.size())), PendingLogprobs(r, job, tokenizer)});
  }

  std::string start() override {
    std::string out;
    for (size_t i = 0; i < choices_.size(); ++i)
      out += sse_event(chat_chunk_json(header_, {{"role", "assistant"}, {"content", ""}}, "", nullptr, i));
    return out;
  }

  std::string text(size_t choice, const std::string& piece) override {
    return delta_events(choice, choices_[choice].parser.feed(piece));
  }

  std::string end(std::span<const JobOutcome* const> outcomes) override {
    std::string out;
    for (size_t i = 0; i < choices_.size(); ++i) {
      const GenerationResult& g = outcomes[i]->result;
      Choice& c = choices_[i];
      out += delta_events(i, c.parser.finish(cut_short(g)));
      Json last = chat_chunk_json(header_, Json::object(), finish_reason_text(g.finish, c.tool_calls_sent && !c.cut_call),
                                  c.logprobs.take(true), i);
      last["stats"] = stats_json(g.stats, outcomes[i]->queue_s);
      out += sse_event(last);
    }
    const JobOutcome& first = *outcomes.front();
    if (request_.include_usage)
      out += sse_event(usage_chunk_json(ApiKind::kChat, header_, usage_json(choices_usage(stats_of(outcomes))),
                                        stats_json(first.result.stats, first.queue_s)));
    return out + "data: [DONE]\n\n";
  }

  std::string error(const ApiError& e) override { return "data: " + e.body() + "\n\n"; }

  std::string complete(std::span<const JobOutcome* const> outcomes) override {
    Json choices = Json::array();
    for (size_t i = 0; i < outcomes.size(); ++i) {
      const GenerationResult& g = outcomes[i]->result;
      ChatOutputParser parser = answer_parser(request_, call_prefix(i));
      ChatDelta body = parser.feed(g.text);
      ChatDelta end = parser.finish(cut_short(g));
      ChatAnswer answer{body.reasoning + end.reasoning, body.content + end.content, std::move(end.tool_calls),
                        end.cut_call, std::move(end.cut_input)};
      // A cut call is returned as written so far, under the reason it was cut ("length").
      const std::string finish = finish_reason_text(g.finish, !answer.tool_calls.empty() && !answer.cut_call);
      choices.push_back(chat_choice_json(i, answer, request_.thinking, finish,
                                         request_.top_logprobs >= 0 ? chat_logprobs_json(g.logprobs, tokenizer_) : Json()));
    }
    const JobOutcome& first = *outcomes.front();
    return dump(chat_completion_json(header_, std::move(choices), usage_json(choices_usage(stats_of(outcomes))),
                                     stats_json(first.result.stats, first.queue_s)));
  }

 private:
  struct Choice {
    ChatOutputParser parser;
    PendingLogprobs logprobs;
    bool tool_calls_sent = false;
    bool cut_call = false;
  };

  // Tool call ids: "call_<response id>_<i>" for the first choice, "call_<response id>_<choice>_<i>" for others.
  std::string call_prefix(size_t choice) const {
    return tool_call_prefix(header_) + (choice ? std::to_string(choice) + "_" : "");
  }

  // Log-probabilities go with the first chunk after they arrive.
  std::string delta_events(size_t i, const ChatDelta& d) {
    Choice& c = choices_[i];
    std::string out;
    if (!d.reasoning.empty())
      out += sse_event(chat_chunk_json(header_, {{"reasoning_content", d.reasoning}}, "", c.logprobs.take(true), i));
    if (!d.content.empty())
      out += sse_event(chat_chunk_json(header_, {{"content", d.content}}, "", c.logprobs.take(true), i));
    if (!d.tool_calls.empty()) {
      c.tool_calls_sent = true;
      c.cut_call = d.cut_call;
      out += sse_event(chat_chunk_json(header_, {{"tool_calls", tool_calls_json(d.tool_calls, true)}}, "", nullptr, i));
    }
    return out;
  }

  ApiRequest request_;
  ResponseHeader header_;
  const text::Tokenizer& tokenizer_;
  std::vector<Choice> choices_;
};

class CompletionFormat final : public ResponseFormat {
 public:
  CompletionFormat(const ApiRequest& r, ResponseHeader h, const Jobs& jobs, const text::Tokenizer& tokenizer)
      : include_usage_(r.include_usage), with_logprobs_(r.top_logprobs >= 0), header_(std::move(h)), tokenizer_(tokenizer) {
    for (const std::shared_ptr<Job>& job : jobs) logprobs_.emplace_back(r, job, tokenizer);
  }

  std::string start() override { return ""; }
  std::string text(size_t choice, const std::string& piece) override {
    return sse_event(completion_chunk_json(header_, piece, "", logprobs_[choice].take(false), choice));
  }
  std::string end(std::span<const JobOutcome* const> outcomes) override {
    std::string out;
    for (size_t i = 0; i < outcomes.size(); ++i) {
      const GenerationResult& g = outcomes[i]->result;
      Json last = completion_chunk_json(header_, "", finish_reason_text(g.finish, false), logprobs_[i].take(false), i);
      last["stats"] = stats_json(g.stats, outcomes[i]->queue_s);
      out += sse_event(last);
    }
    const JobOutcome& first = *outcomes.front();
    if (include_usage_)
      out += sse_event(usage_chunk_json(ApiKind::kCompletion, header_, usage_json(choices_usage(stats_of(outcomes))),
                                        stats_json(first.result.stats, first.queue_s)));
    return out + "data: [DONE]\n\n";
  }
  std::string error(const ApiError& e) override { return "data: " + e.body() + "\n\n"; }
  std::string complete(std::span<const JobOutcome* const> outcomes) override {
    Json choices = Json::array();
    for (size_t i = 0; i < outcomes.size(); ++i) {
      const GenerationResult& g = outcomes[i]->result;
      choices.push_back(completion_choice_json(i, g.text, finish_reason_text(g.finish, false),
                                               with_logprobs_ ? completion_logprobs_json(g.logprobs, tokenizer_) : Json()));
    }
    const JobOutcome& first = *outcomes.front();
    return dump(completion_json(header_, std::move(choices), usage_json(choices_usage(stats_of(outcomes))),
                                stats_json(first.result.stats, first.queue_s)));
  }

 private:
  bool include_usage_, with_logprobs_;
  ResponseHeader header_;
  const text::Tokenizer& tokenizer_;
  std::vector<PendingLogprobs> logprobs_;
};

}  // namespace

ChatOutputParser answer_parser(const ApiRequest& r, const std::string& id_prefix) {
  return ChatOutputParser(r.thinking, r.tools, id_prefix);
}

bool cut_short(const GenerationResult& g) { return g.finish != FinishReason::kStop || !g.stop_string.empty(); }

std::vector<GenerationRoute> openai_routes(const RequestDefaults& defaults, const RequestLimits& limits,
                                           const text::Tokenizer& tokenizer) {
  auto error_body = [](const ApiError& e) { return e.body(); };
  std::vector<GenerationRoute> routes;
  routes.push_back(GenerationRoute{
      "/v1/chat/completions", "chatcmpl-", chat_request_fields(),
      [defaults, limits](const Json& body) { return parse_chat_request(body, defaults, limits); },
      [&tokenizer](const ApiRequest& r, const ResponseHeader& h, const Jobs& jobs)
          -> std::unique_ptr<ResponseFormat> { return std::make_unique<ChatFormat>(r, h, jobs, tokenizer); },
      nullptr, error_body});
  routes.push_back(GenerationRoute{
      "/v1/completions", "cmpl-", completion_request_fields(),
      [defaults, limits](const Json& body) { return parse_completion_request(body, defaults, limits); },
      [&tokenizer](const ApiRequest& r, const ResponseHeader& h, const Jobs& jobs)
          -> std::unique_ptr<ResponseFormat> { return std::make_unique<CompletionFormat>(r, h, jobs, tokenizer); },
      nullptr, error_body});
  return routes;
}

}  // namespace dsv4::server
