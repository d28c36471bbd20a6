// References by identifier: every "$ref" of a schema document resolved, as RFC 3986 resolves a
// reference against its base URI, to a JSON pointer within the document ("#/…"). Bases come
// from "$id" (draft 4's "id" where "$schema" says draft-04) on the root and on any subschema;
// fragments are JSON pointers or plain names ("$anchor", "$dynamicAnchor", or a "#name" $id).
// A reference to nothing in the document (another file, a server) is left as written, for the
// compiler to refuse by name. Internal to the constrain folder.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace dsv4::constrain {

using Json = nlohmann::ordered_json;

// `reference` resolved against `base` (RFC 3986 section 5.2, dot segments removed).
std::string resolve_uri(const std::string& base, const std::string& reference);

// A copy of `document` with every resolvable "$ref" written as "#<pointer>", or nullopt when
// none needs it (every ref is already "#…" and no subschema below the root has an id).
std::optional<Json> with_local_refs(const Json& document);

}  // namespace dsv4::constrain
