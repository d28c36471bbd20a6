// JSON Schema -> grammar nodes (grammar.h). The supported subset (docs/constrained-decoding.md
// has the details), everything else refused with the keyword and where it is:
//   type          object, array, string, number, integer, boolean, null, or a list of them
//                 (without type: the types the other keywords imply, or any value)
//   object        properties (written in the schema's order; false forbids a name), required,
//                 additionalProperties (false; true / absent / a schema: other keys after the
//                 declared ones), patternProperties (other keys from the first pattern),
//                 propertyNames (string pattern / format / lengths / constants),
//                 minProperties / maxProperties where the shape decides them
//   array         items (a schema or a boolean), minItems, maxItems; tuples: prefixItems with
//                 items, or items as a list with additionalItems
//   number        minimum, maximum, exclusiveMinimum, exclusiveMaximum (draft-4 booleans or
//                 2020-12 numbers; numbers: whole-number bounds; written without exponent),
//                 multipleOf (a whole number: integers through an automaton of remainders)
//   string        minLength, maxLength (code points), pattern (ECMA-262, regex.h), format
//                 (date-time, date, time, duration, email, hostname, ipv4, ipv6, uri,
//                 uri-reference, uuid; other formats are annotations)
//   any type      enum, const (with type: values of other types are dropped; with string
//                 keywords or not: the strings that break them), not of types and constants,
//                 anyOf, oneOf (where its alternatives are told apart by type, constants or a
//                 discriminating property), $ref to "#" or any JSON pointer in the same
//                 document ("#/$defs/…", "#/definitions/…") or by $id / $anchor
//                 (schema_refs.h), $defs / definitions
//   rewritten     allOf (merged), applicators beside other keywords, other nots (De Morgan),
//                 if/then/else, dependentRequired / dependentSchemas / dependencies,
//                 unevaluatedProperties: as alternatives of plain schemas (schema_algebra.h)
//   ignored       every keyword that is not an assertion or applicator of JSON Schema: the
//                 annotations (title, description, default, examples, $comment, readOnly, …),
//                 vendor keywords (x-*, markdownDescription, id, …) and misspellings, as the
//                 specification says a validator must; also uniqueItems: false
//   unsupported   the assertions and applicators it cannot enforce (contains,
//                 unevaluatedItems, …; unsupported_keywords()): refused naming keyword
//                 and path, or, when the schema is not strict, dropped and listed in dropped()
// Booleans as schemas: true = any value, false = none.
//
// What is generated is always valid for the schema, though not every valid text can be
// generated: properties come in the declared order, free keys carry no escapes, numbers
// have at most 15 integer / 15 fraction / 2 exponent digits, whitespace between tokens runs
// at most kMaxWhitespace bytes, nesting at most kMaxFrames.
//
// Hostile schemas are bounded (SchemaLimits): nodes, properties, enum values and bytes,
// anyOf alternatives, nesting of the schema itself; cycles of bare $refs are refused.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsv4/constrain/grammar.h"
#include "dsv4/util/error.h"

namespace dsv4::constrain {

using Json = nlohmann::ordered_json;

// A schema outside the subset or beyond the limits. `path` leads from the document's root to
// the offending schema (object keys and array indices); `keyword` is the keyword at fault
// ("" when the schema as a whole is); `where` names the document (e.g.
// "response_format.json_schema.schema"; "" until a caller sets it with at()).
class SchemaError : public Error {
 public:
  SchemaError(std::vector<std::string> path, std::string keyword, const std::string& reason, std::string where = "");
  const std::vector<std::string>& path() const { return path_; }
  const std::string& keyword() const { return keyword_; }
  const std::string& reason() const { return reason_; }
  const std::string& where() const { return where_; }
  // where + path + keyword, dotted: "response_format.json_schema.schema.properties.name.pattern".
  std::string param() const;
  // The same error inside the document called `where`.
  SchemaError at(std::string where) const { return SchemaError(path_, keyword_, reason_, std::move(where)); }

 private:
  std::vector<std::string> path_;
  std::string keyword_, reason_, where_;
};

struct SchemaLimits {
  size_t max_nodes = 20000;          // grammar nodes from one schema
  size_t max_properties = 1024;      // per object
  size_t max_enum_values = 4096;     // values of all enums together
  size_t max_literal_bytes = 128 << 10;  // their JSON text, together
  size_t max_alternatives = 256;     // per anyOf
  size_t max_depth = 64;             // nesting of the schema document
  uint32_t max_automaton_states = 1u << 18;  // pattern/format automata built, together
};

// Whether `keyword` is an assertion or applicator of JSON Schema (one the compiler enforces or
// one it refuses); every other keyword is an annotation and is ignored.
bool is_assertion(std::string_view keyword);
// The assertions the compiler cannot enforce (for documentation and tests).
const std::vector<std::string>& unsupported_keywords();

class SchemaCompiler {
 public:
  explicit SchemaCompiler(Grammar& g, SchemaLimits limits = {});
  ~SchemaCompiler();

  // The value node for `document` (its $refs resolve within it). With `dsml_safe` the text
  // can sit inside a DSML parameter: strings never contain the raw bytes of ｜DSML｜ and
  // constants are written ASCII-only. Throws SchemaError. Not `strict`: assertions it cannot
  // enforce are dropped (see dropped()) instead of refused.
  NodeId compile(const Json& document, bool dsml_safe = false, bool strict = true);
  // The value node for `part`, a schema inside `document` at `path` (its $refs resolve in
  // `document`; targets shared by several parts are compiled once). `document` must outlive
  // the compiler.
  NodeId compile_part(const Json& document, const Json& part, std::vector<std::string> path, bool dsml_safe,
                      bool strict = true);

  // Throws `e` when `strict`, else records it among the dropped assertions.
  void unsupported(bool strict, SchemaError e);
  // What non-strict compiles dropped so far, in order (`where` unset).
  const std::vector<SchemaError>& dropped() const { return dropped_; }

  // Any JSON value / any JSON object.
  NodeId any_value(bool dsml_safe = false);
  NodeId any_object(bool dsml_safe = false);

 private:
  struct Doc;
  NodeId compile_schema(Doc& d, const Json& s, size_t depth);
  NodeId compile_ref(Doc& d, const Json& s, size_t depth);
  NodeId compile_merged(Doc& d, const Json& s, size_t depth);
  NodeId compile_alternatives(Doc& d, const Json& alts, const char* keyword, size_t depth);
  // What a simple "not" excludes: types and constants.
  struct Excluded {
    std::vector<std::string> types;
    std::vector<Json> values;
  };
  Excluded excluded(Doc& d, const Json& n);
  NodeId compile_literal(Doc& d, const Json& s, const std::vector<std::string>& types, const Excluded& ex);
  NodeId compile_object(Doc& d, const Json& s, size_t depth);
  NodeId compile_array(Doc& d, const Json& s, size_t depth);
  NodeId compile_contains(Doc& d, const Json& s, size_t depth);
  NodeId compile_tuple(Doc& d, const Json& s, const char* prefix_key, const char* rest_key, uint32_t lo, uint32_t hi,
                       size_t depth);
  NodeId compile_string(Doc& d, const Json& s, const std::vector<std::string>& excluded);
  NodeId compile_number(Doc& d, const Json& s, bool integer, const std::vector<Json>& excluded);
  NodeId bounded_number(Doc& d, std::optional<ByteDfa> bounds, uint64_t multiple, bool integer,
                        const std::vector<Json>& excluded);
  std::pair<uint32_t, uint32_t> string_lengths(Doc& d, const Json& s);
  // The automaton of a string schema's pattern and known format, intersected (nullopt: it has
  // neither, or what it has was dropped as not strict).
  std::optional<ByteDfa> text_automaton(Doc& d, const Json& s);
  std::optional<ByteDfa> name_automaton(Doc& d, const Json& n);
  uint32_t automaton_budget(Doc& d, const char* keyword) const;
  void check_budget(Doc& d, const std::string& keyword);
  void check_keyword(Doc& d, const Json& s, const std::string& key);
  void unsupported(Doc& d, const std::string& keyword, const std::string& why);
  std::string forbid(bool dsml_safe) const;

  Doc& doc(const Json& document, bool dsml_safe, bool strict);

  Grammar& g_;
  SchemaLimits limits_;
  std::vector<std::unique_ptr<Doc>> docs_;
  std::vector<std::unique_ptr<Json>> local_docs_;  // documents with references made local
  NodeId any_[2] = {kNoNode, kNoNode};
  NodeId any_object_[2] = {kNoNode, kNoNode};
  size_t enum_values_ = 0, literal_bytes_ = 0;
  uint64_t automaton_states_ = 0;
  size_t merge_values_left_ = size_t{1} << 18;  // JSON values allOf rewriting may copy, per request
  std::vector<SchemaError> dropped_;
};

// The raw text of ｜DSML｜ (kept out of strings inside DSML parameters).
std::string dsml_marker();

}  // namespace dsv4::constrain
