// dsv4 tokenize -t TOKENIZER_JSON [--jsonl] [--decode]
//
//   (default)          all of stdin is one text; prints its ids comma-separated on one line
//   --jsonl            each stdin line is a JSON string; prints one JSON array of ids per line
//   --decode           stdin holds ids separated by commas and/or whitespace; prints the text
//                      exactly (no newline added)
//   --jsonl --decode   each stdin line is a JSON array of ids; prints one JSON string per line
//   --chat             each stdin line is a chat completion request body (messages, tools,
//                      tool_choice, reasoning_effort, ...); prints the ids of the prompt that
//                      `dsv4 serve` would prefill for it, one JSON array per line (an agent
//                      trace's token accounting: scripts/agent_trace.mjs)
//
// Added-token strings in the text (e.g. "<｜User｜>") become their ids; no BOS is added. Text
// that is not valid UTF-8 has each bad sequence replaced by U+FFFD. Any error: one line on
// stderr, exit status 1.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/cli/common.h"
#include "dsv4/server/openai_api.h"
#include "dsv4/text/tokenizer.h"
#include "dsv4/util/error.h"

namespace dsv4::cli {
namespace {

using text::TokenId;

std::string join_ids(const std::vector<TokenId>& ids, const char* separator) {
  std::string out;
  out.reserve(ids.size() * 7);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += separator;
    out += std::to_string(ids[i]);
  }
  return out;
}

std::vector<TokenId> json_id_array(const nlohmann::json& j, size_t line_no) {
  if (!j.is_array()) fail("stdin line {}: expected a JSON array of token ids", line_no);
  std::vector<TokenId> ids;
  ids.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail("stdin line {}: {} is not a token id", line_no, v.dump());
    ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
  }
  return ids;
}

nlohmann::json parse_line(const std::string& line, size_t line_no) {
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail("stdin line {}: not valid JSON: {}", line_no, e.what());
  }
}

}  // namespace

int tokenize(const TokenizeOptions& o) {
  const text::Tokenizer tokenizer = text::Tokenizer::from_file(o.tokenizer);
  std::ios::sync_with_stdio(false);
  if (o.chat) {
    if (o.decode) fail("--chat encodes requests; it does not go with --decode");
    std::string line;
    size_t line_no = 0;
    const server::RequestDefaults defaults;
    while (std::getline(std::cin, line)) {
      ++line_no;
      server::ApiRequest r;
      try {
        r = server::parse_chat_request(server::parse_json_body(line), defaults);
      } catch (const std::exception& e) {
        fail("stdin line {}: {}", line_no, e.what());
      }
      const std::string out = "[" + join_ids(tokenizer.encode(r.prompt_text, r.prompt_caller), ",") + "]\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
    return std::fflush(stdout) == 0 ? 0 : 1;
  }
  if (!o.jsonl) {
    const std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    if (o.decode) {
      const std::string out = tokenizer.decode(parse_token_ids(input, "stdin"));
      std::fwrite(out.data(), 1, out.size(), stdout);
    } else {
      const std::string out = join_ids(tokenizer.encode(input), ",") + "\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
    return std::fflush(stdout) == 0 ? 0 : 1;
  }
  std::string line, out;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    const nlohmann::json j = parse_line(line, line_no);
    if (o.decode) {
      out = nlohmann::json(tokenizer.decode(json_id_array(j, line_no))).dump();
    } else {
      if (!j.is_string()) fail("stdin line {}: expected a JSON string", line_no);
      out = "[" + join_ids(tokenizer.encode(j.get_ref<const std::string&>()), ",") + "]";
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace dsv4::cli
