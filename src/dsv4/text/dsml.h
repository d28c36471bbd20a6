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

}  // namespace dsv4::text::dsml
