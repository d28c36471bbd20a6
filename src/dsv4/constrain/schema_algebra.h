// Facts about JSON Schemas and the rewriting that turns the combinations the compiler cannot
// generate directly (allOf, unevaluatedProperties, applicators beside other keywords) into
// alternatives of plain schemas it can (json_schema.cc). Internal to the constrain folder.
//
// A plain schema has no allOf, anyOf, oneOf, $ref or unevaluatedProperties at its top; its
// subschemas may have them (they are rewritten when they are compiled). Merging two plain
// schemas is exact for the keywords the compiler enforces: types intersect, enums intersect,
// bounds tighten, required names join, and each property's schema becomes the allOf of what
// each side says of that name (its own schema, else its additionalProperties, else anything);
// what cannot be merged exactly is refused by name.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::constrain {

using Json = nlohmann::ordered_json;

const std::vector<std::string>& type_names();
bool value_has_type(const Json& v, const std::string& t);
std::string percent_decode(const std::string& s);
// The schema a chain of local $refs leads to (bounded; a ref it cannot follow stays).
const Json& follow_refs(const Json& root, const Json& s);
// The types a schema without "type" implies by its keywords, in the order the compiler writes
// them (object, array, number, string; empty: none, any value).
std::vector<std::string> implied_types(const Json& s);
// Whether every value the compiler generates from `a` fails `b` (a sound test: false when unsure).
bool fails_other(const Json& root, const Json& a, const Json& b);
// Whether `s` asserts nothing (true, or an object of annotations only).
bool asserts_nothing(const Json& s);

struct MergeContext {
  const Json& root;
  // Refuses (strict) or records (not strict) what cannot be enforced; returns when not strict.
  std::function<void(const std::string& keyword, const std::string& why)> unsupported;
  // A schema error: throws.
  std::function<void(const std::string& keyword, const std::string& why)> error;
  size_t max_alternatives;
  size_t values_left;  // JSON values the rewriting may still copy (a hostile schema's bound)
};

// Whether `n` is a "not" the compiler applies directly: of types, constants, or anyOf of those.
bool simple_exclusion(const Json& n);
// The types and constants a simple exclusion names (true: every type).
void collect_exclusion(const Json& n, std::vector<std::string>& types, std::vector<Json>& values);
// Whether compile_schema must rewrite `s` first.
bool needs_merge(const Json& s);
// The one part a trivial allOf stands for (the others and the holder assert nothing), if so.
const Json* sole_part(const Json& s);
// `s` as alternatives of plain schemas (anyOf of them is `s`); empty: no value satisfies it.
std::vector<Json> plain_alternatives(MergeContext& c, const Json& s);

}  // namespace dsv4::constrain
