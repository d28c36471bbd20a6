#include "dsv4/server/request_fields.h"

#include <cctype>

#include <fmt/format.h>

namespace dsv4::server {

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::number_float: return "a number";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    default: return "an unsupported value";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const Json& got) {
  throw_bad_request(param, "invalid_type",
                    fmt::format("Invalid type for '{}': expected {}, but got {}.", param, expected, type_name(got)));
}

[[noreturn]] void bad_value(const std::string& param, const std::string& why) {
  throw_bad_request(param, "invalid_value", fmt::format("Invalid value for '{}': {}", param, why));
}

[[noreturn]] void unsupported(const std::string& param, const std::string& why) {
  throw_bad_request(param, "unsupported_value", fmt::format("Unsupported value for '{}': {}", param, why));
}

[[noreturn]] void missing(const std::string& param) {
  throw_bad_request(param, "missing_required_parameter", fmt::format("Missing required parameter: '{}'.", param));
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }
std::string at_index(const std::string& prefix, size_t i) { return fmt::format("{}[{}]", prefix, i); }

bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

}  // namespace dsv4::server
