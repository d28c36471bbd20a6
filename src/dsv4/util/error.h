// One exception type for everything a user can cause: a bad file, flag, request or budget.
// The message is a single line that names the file, tensor, field or parameter at fault.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dsv4
