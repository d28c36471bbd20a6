// Reading request bodies field by field: every getter checks the type strictly and names the
// field (with its path, e.g. "messages[2].content") in the 400 it throws. Shared by the OpenAI
// and Anthropic parsers so both report bad input the same way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dsv4/server/api_error.h"

namespace dsv4::server {

using Json = nlohmann::ordered_json;  // key order matters: tool schemas are rendered in order

// The top-level fields an endpoint reads.
using FieldList = std::vector<std::string_view>;

// "null", "a boolean", "a string", "an array", "an object", "a number", "an integer".
const char* type_name(const Json& v);

// 400s naming `param`: invalid_type, invalid_value, unsupported_value, missing_required_parameter.
[[noreturn]] void wrong_type(const std::string& param, const char* expected, const Json& got);
[[noreturn]] void bad_value(const std::string& param, const std::string& why);
[[noreturn]] void unsupported(const std::string& param, const std::string& why);
[[noreturn]] void missing(const std::string& param);

// "a.b" (or "b" at the top level) and "a[3]".
std::string join(const std::string& prefix, const std::string& key);
std::string at_index(const std::string& prefix, size_t i);

// A tool (function) name: 1 to 64 letters, digits, '_' or '-'.
bool valid_function_name(const std::string& s);

// Reads the fields of one JSON object; every getter checks the type strictly and names the
// field (with its path) in the error. Absent and null are the same ("not given"). A body's
// top level knows its endpoint's field list and refuses to read anything outside it (a
// std::logic_error: the list must name every field the parser reads, since the body parser
// skips the others unbuilt).
class Fields {
 public:
  Fields(const Json& object, std::string path, const FieldList* known = nullptr)
      : obj_(object), path_(std::move(path)), known_(known) {}

  std::string name(const std::string& key) const { return join(path_, key); }

  const Json* find(const std::string& key) const {
    if (known_ && std::find(known_->begin(), known_->end(), key) == known_->end())
      throw std::logic_error(fmt::format("the request parser reads '{}', which is not in its field list", key));
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  const Json& require(const std::string& key) const {
    const Json* v = find(key);
    if (!v) missing(name(key));
    return *v;
  }

  std::optional<std::string> string(const std::string& key, size_t max_bytes = SIZE_MAX) const {
    const Json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(name(key), "a string", *v);
    const std::string& s = v->get_ref<const std::string&>();
    if (s.size() > max_bytes) bad_value(name(key), fmt::format("at most {} bytes are allowed, got {}.", max_bytes, s.size()));
    return s;
  }
  std::optional<bool> boolean(const std::string& key) const {
    const Json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(name(key), "a boolean", *v);
    return v->get<bool>();
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) const {
    const Json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) wrong_type(name(key), "an integer", *v);
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
      bad_value(name(key), fmt::format("must be at most {}, got {}.", hi, v->get<uint64_t>()));
    const int64_t x = v->get<int64_t>();
    if (x < lo) bad_value(name(key), fmt::format("must be at least {}, got {}.", lo, x));
    if (x > hi) bad_value(name(key), fmt::format("must be at most {}, got {}.", hi, x));
    return x;
  }
  // A number in [lo, hi] (lo excluded when `lo_open`).
  std::optional<double> number(const std::string& key, double lo, double hi, bool lo_open = false) const {
    const Json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(name(key), "a number", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
      bad_value(name(key), fmt::format("must be in {}{}, {}], got {}.", lo_open ? "(" : "[", lo, hi, x));
    return x;
  }
  const Json* object(const std::string& key) const {
    const Json* v = find(key);
    if (v && !v->is_object()) wrong_type(name(key), "an object", *v);
    return v;
  }
  const Json* array(const std::string& key) const {
    const Json* v = find(key);
    if (v && !v->is_array()) wrong_type(name(key), "an array", *v);
    return v;
  }

 private:
  const Json& obj_;
  std::string path_;
  const FieldList* known_;
};

}  // namespace dsv4::server
