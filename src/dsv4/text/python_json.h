// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it, which is what
// the official DeepSeek-V4 encoder puts into prompts (tool schemas, response formats, non-string
// tool-call arguments): ", " and ": " separators, key order kept, non-ASCII characters written
// as themselves, floats in Python repr() form (1e-05, 100.0, 1e+16).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dsv4::text {

std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace dsv4::text
