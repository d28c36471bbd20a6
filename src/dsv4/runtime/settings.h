// The one place that knows every setting: each flag and DSV4_* environment variable with
// its type, default and help. The command line is built from this table, environment
// variables give flag defaults, and an unknown DSV4_* variable or flag is rejected with
// a "did you mean".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

struct Setting {
  std::string key;      // "ram"
  std::string flag;     // "--ram" (empty: environment only)
  std::string env;      // "DSV4_RAM" (empty: flag only)
  std::string type;     // "size", "int", "float", "string", "bool", "path", "list"
  std::string fallback; // default, as text ("" = none)
  std::string help;
};

const std::vector<Setting>& all_settings();
// Throws Error if `key` is not in the table (a programming error caught by tests).
const Setting& setting(std::string_view key);

// The closest candidate by edit distance, or "" when nothing is reasonably close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// Returns one error line per DSV4_* variable in `environ` that no setting knows.
std::vector<std::string> unknown_environment(char** environ);

// The value of a setting's environment variable, or "" when unset or env-less.
std::string env_value(std::string_view key);

// Human-readable table of every setting (for `dsv4 settings`).
std::string describe_settings();

}  // namespace dsv4
