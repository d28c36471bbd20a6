// DSML, the markup DeepSeek-V4 writes tool calls in:
//
//   \n\n<｜DSML｜tool_calls>\n
//   <｜DSML｜invoke name="NAME">\n
//   <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>\n
//   <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>\n
//   </｜DSML｜invoke>\n
//   </｜DSML｜tool_calls>
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dsv4/text/chat_format.h"

namespace dsv4::text::dsml {

// "\n\n<｜DSML｜tool_calls" — where a tool-call block starts in generated text.
std::string tool_calls_start();

// The block for OpenAI tool calls [{"function":{"name", "arguments"}}] (arguments: a JSON text
// or an already-parsed object), including the leading blank line; names and values are caller text.
chat::Prompt render_tool_calls(const chat::Json& tool_calls);

// Parses from just after tool_calls_start() through the closing </｜DSML｜tool_calls>; returns
// the calls (ids left empty) and sets `end` to the index after the block. Throws Error.
std::vector<chat::ToolCall> parse_tool_calls(std::string_view text, size_t begin, size_t& end);

// A tool-call block cut short (the answer hit its token limit or a stop string): the calls
// whose name was written, the last one possibly cut.
struct CutToolCalls {
  std::vector<chat::ToolCall> calls;  // ids left empty
  // The last call is cut: its arguments are the prefix written so far of the text the whole
  // call would have given (parse_tool_calls' arguments), e.g. {"city": "Par
  bool last_cut = false;
  // The last call's parameters written so far as an object (a cut string value as far as it
  // went; a cut non-string value only if it is JSON already; a cut name left out).
  chat::Json last_input = chat::Json::object();
};
// Parses the text from just after tool_calls_start() to its end, which is inside the block.
// The complete invokes go through parse_tool_calls (so they agree with it); a cut invoke is
// read as far as it goes, and dropped while its name is still being written. Throws Error
// when the complete part is malformed.
CutToolCalls parse_cut_tool_calls(std::string_view text, size_t begin);

}  // namespace dsv4::text::dsml
