#include "dsv4/text/unicode_delta.h"

#include <span>

#include <fmt/format.h>

namespace dsv4::text {
namespace {

struct CodeRange {
  char32_t lo;
  char32_t hi;
};

#include "dsv4/text/unicode_delta.inc"

std::span<const CodeRange> added_to(std::string_view category) {
  if (category == "L") return kAdded_L;
  if (category == "M") return kAdded_M;
  if (category == "N") return kAdded_N;
  if (category == "P") return kAdded_P;
  if (category == "S") return kAdded_S;
  if (category == "Nd") return kAdded_Nd;
  return {};
}

std::string class_items(std::span<const CodeRange> ranges) {
  std::string out;
  for (const CodeRange& r : ranges) {
    out += fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(r.lo));
    if (r.hi != r.lo) out += fmt::format("-\\x{{{:X}}}", static_cast<uint32_t>(r.hi));
  }
  return out;
}

}  // namespace

std::string widen_unicode_classes(std::string_view p) {
  std::string out;
  out.reserve(p.size());
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 'Q') {  // \Q...\E quotes everything up to \E
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      if (n == 'p') {
        std::string_view name;
        size_t next;
        if (i + 2 < p.size() && p[i + 2] == '{') {
          const size_t close = p.find('}', i + 3);
          if (close == std::string_view::npos) {
            out.append(p.substr(i));  // malformed: let PCRE2 report it
            break;
          }
          name = p.substr(i + 3, close - i - 3);
          next = close + 1;
        } else {
          name = p.substr(i + 2, 1);
          next = i + 3;
        }
        const auto extra = added_to(name);
        const std::string_view original = p.substr(i, next - i);
        if (extra.empty()) {
          out.append(original);
        } else if (in_class) {
          out.append(original).append(class_items(extra));
        } else {
          out.append("[").append(original).append(class_items(extra)).append("]");
        }
        i = next;
        continue;
      }
      out.append(p.substr(i, 2));  // any other escape, e.g. \[ \] \\ \x
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      const size_t stop = end == std::string_view::npos ? i + 1 : end + 2;
      out.append(p.substr(i, stop - i));
      i = stop;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

}  // namespace dsv4::text
