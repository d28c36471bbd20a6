// The one place that knows every setting: each flag and DSV4_* environment variable with its
// kind, typed default, range and help. The command line is built from this table
// (src/dsv4/cli/main.cc binds fields by key), option structs take their defaults from it
// (`setting_default<T>(key)`), every value a user gives — flag or variable — goes through
// one strict parser per kind, and an unknown DSV4_* variable, flag or command is refused with
// a "did you mean".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dsv4 {

enum class SettingKind : uint8_t {
  kBool,      // true|false, on|off, yes|no, 1|0
  kInt,       // a whole number (decimal digits, '-' only where the range allows) in [min, max]
  kUint,      // the same, unsigned 64-bit (seeds)
  kFloat,     // a finite decimal number in [min, max]
  kSize,      // bytes: 123456, 800K, 512M, 1.5G, 2T (K = 1024; optional i / B suffix)
  kRam,       // a size, "min" (smallest budget that works) or "auto" (a share of available memory)
  kChoice,    // one of `choices`
  kChoices,   // a comma-separated list of `choices`
  kInts,      // comma- or space-separated whole numbers in [min, max]
  kText,      // any text
  kPath,      // a file or directory path
  kRepeated,  // text; the flag may be given several times
};

// A parsed (or default) value. monostate: no value (a default of "none": the code decides,
// e.g. the temperature comes from generation_config.json).
using SettingValue = std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string,
                                  std::vector<std::string>, std::vector<int64_t>>;

struct Setting {
  std::string key;   // "ram"
  std::string flag;  // "--ram" (CLI11 syntax, e.g. "-m,--model"; "prompt" = positional; "" = env only)
  std::string env;   // "DSV4_RAM" ("" = flag only)
  SettingKind kind = SettingKind::kText;
  SettingValue fallback;  // the typed default
  std::string help;
  int64_t min_int = 0, max_int = 0;        // kInt, kInts (inclusive)
  uint64_t max_uint = 0;                   // kUint (from 0)
  double min_float = 0, max_float = 0;     // kFloat (inclusive, but see min_exclusive)
  bool min_exclusive = false;              // kFloat: the value must be above min_float
  std::vector<std::string> choices;        // kChoice, kChoices

  // The long flag ("--model" of "-m,--model") or the positional's name.
  std::string flag_name() const;
};

// "int", "size", "choice", ... (the kind column of `dsv4 settings`).
const char* kind_name(SettingKind k);

const std::vector<Setting>& all_settings();
// Throws Error if `key` is not in the table (a programming error caught by tests).
const Setting& setting(std::string_view key);

// Parses `text` as `s` says; `source` names what the user wrote ("--seed", "DSV4_SEED") in the
// one-line Error thrown when the text does not parse exactly or is out of range.
SettingValue parse_setting(const Setting& s, std::string_view text, std::string_view source);
// The text `dsv4 settings` prints for a value ("-" for none); parse_setting accepts it back.
std::string format_setting_value(const Setting& s, const SettingValue& v);
// What `s` accepts, in words ("a whole number from 0 to 1024").
std::string describe_accepted(const Setting& s);

// Stores a value into a typed field (the conversions the table's kinds allow).
void store_setting(const SettingValue& v, bool& out);
void store_setting(const SettingValue& v, int& out);
void store_setting(const SettingValue& v, int64_t& out);
void store_setting(const SettingValue& v, uint64_t& out);
void store_setting(const SettingValue& v, float& out);
void store_setting(const SettingValue& v, double& out);
void store_setting(const SettingValue& v, std::string& out);
void store_setting(const SettingValue& v, std::vector<std::string>& out);
void store_setting(const SettingValue& v, std::vector<int64_t>& out);
void store_setting(const SettingValue& v, std::vector<int32_t>& out);
template <typename T>
void store_setting(const SettingValue& v, std::optional<T>& out) {
  if (std::holds_alternative<std::monostate>(v)) {
    out.reset();
    return;
  }
  T value{};
  store_setting(v, value);
  out = value;
}

// The typed default of a setting: the one place defaults are written down.
template <typename T>
T setting_default(std::string_view key) {
  T value{};
  store_setting(setting(key).fallback, value);
  return value;
}

// The closest candidate by edit distance, or "" when nothing is reasonably close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// Returns one error line per DSV4_* variable in `env` (NAME=VALUE strings, null-terminated) that
// no setting knows.
std::vector<std::string> unknown_environment(char** env);

// Human-readable table of every setting (for `dsv4 settings`): names, kind, the default as
// parse_setting accepts it, what is accepted, help.
std::string describe_settings();

}  // namespace dsv4
