// The grammar of a whole constrained chat answer, in the DeepSeek-V4 chat format (spec §5.2):
//
//   [reasoning up to </think>]          thinking mode only (the prompt ended with <think>)
//   then one of
//     JSON content                       response_format json_object / json_schema
//     a DSML tool-call block             tool_choice required / a named function:
//       \n\n<｜DSML｜tool_calls>\n
//       <｜DSML｜invoke name="NAME">\n
//       <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>\n   (strings)
//       <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>          (any value)
//       \n</｜DSML｜invoke>              (invokes joined by \n)
//       \n</｜DSML｜tool_calls>
//     either of them                     JSON content while tools are offered (tool_choice auto)
//
// Each call's parameters follow the tool's `parameters` schema (json_schema.h): the declared
// properties in order, the required ones always, each value either raw text (for values a
// string may take) or JSON. The reasoning may not spell "</think>" (the output parser ends the
// reasoning at that text); no string inside the block spells ｜DSML｜ (the parser reads
// parameters up to that text).
#pragma once

#include <string>
#include <vector>

#include "dsv4/constrain/grammar.h"
#include "dsv4/constrain/json_schema.h"

namespace dsv4::constrain {

struct ToolSchema {
  std::string name;                  // the function name
  const Json* parameters = nullptr;  // its parameters schema (nullptr: no parameters)
  std::string where;                 // for errors, e.g. "tools[2].function.parameters"
  bool strict = true;                // false: drop the assertions it cannot enforce (see below)
};

struct AnswerFormat {
  bool thinking = false;                 // reasoning comes first, up to </think>
  const Json* content_schema = nullptr;  // the content is JSON valid for this schema
  std::string content_where;             // for errors, e.g. "response_format.json_schema.schema"
  bool content_strict = true;            // false: drop the assertions it cannot enforce
  std::vector<ToolSchema> tools;         // calls the answer may make (or must, see calls_required)
  bool calls_required = false;           // the answer is a tool-call block (content_schema unused)
  size_t max_calls = 1;                  // invokes in one block
};

// Throws SchemaError (with `where` set) for a schema outside the subset, Error otherwise. A
// schema that is not strict has the assertions the compiler cannot enforce dropped instead of
// refused; `dropped` (if given) receives each one's place, e.g.
// "response_format.json_schema.schema.properties.id.pattern".
Grammar build_answer_grammar(const AnswerFormat& format, const SchemaLimits& limits = {},
                             std::vector<std::string>* dropped = nullptr);

}  // namespace dsv4::constrain
