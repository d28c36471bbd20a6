#include "dsv4/text/python_json.h"

#include <cmath>

#include <fmt/format.h>

#include "dsv4/util/error.h"

namespace dsv4::text {
namespace {

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out.push_back(c);
    }
  }
  out.push_back('"');
}

// Python's float repr: the shortest digits that round-trip, in fixed notation when the decimal
// exponent is in [-4, 16), otherwise d.ddde±XX; integral values keep a ".0".
void dump_float(double v, std::string& out) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "Infinity" : "-Infinity";
    return;
  }
  // fmt's "{:e}" with no precision is not shortest; "{}" is (Dragonbox). Take its digits and
  // exponent and lay them out again the Python way.
  std::string shortest = fmt::format("{}", v);
  std::string sign;
  if (!shortest.empty() && shortest[0] == '-') {
    sign = "-";
    shortest.erase(0, 1);
  }
  int exponent = 0;
  if (const size_t e = shortest.find_first_of("eE"); e != std::string::npos) {
    exponent = std::stoi(shortest.substr(e + 1));
    shortest.resize(e);
  }
  std::string digits;
  int point = static_cast<int>(shortest.size());  // position of the decimal point within digits
  for (size_t i = 0; i < shortest.size(); ++i) {
    if (shortest[i] == '.')
      point = static_cast<int>(digits.size());
    else
      digits.push_back(shortest[i]);
  }
  point += exponent;
  // Strip leading zeros (adjusting the point) and trailing zeros.
  size_t lead = 0;
  while (lead + 1 < digits.size() && digits[lead] == '0') ++lead;
  digits.erase(0, lead);
  point -= static_cast<int>(lead);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (digits == "0") {
    out += sign + "0.0";
    return;
  }
  const int decimal_exponent = point - 1;  // value = d.ddd × 10^decimal_exponent
  out += sign;
  if (decimal_exponent >= -4 && decimal_exponent < 16) {
    if (point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", decimal_exponent < 0 ? '-' : '+', std::abs(decimal_exponent));
  }
}

void dump(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null: out += "null"; break;
    case nlohmann::ordered_json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case nlohmann::ordered_json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case nlohmann::ordered_json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case nlohmann::ordered_json::value_t::number_float: dump_float(v.get<double>(), out); break;
    case nlohmann::ordered_json::value_t::string: dump_string(v.get_ref<const std::string&>(), out); break;
    case nlohmann::ordered_json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump(item, out);
      }
      out.push_back(']');
      break;
    }
    case nlohmann::ordered_json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(key, out);
        out += ": ";
        dump(item, out);
      }
      out.push_back('}');
      break;
    }
    default: fail("cannot write a binary or discarded JSON value");
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace dsv4::text
