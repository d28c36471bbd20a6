#include "dsv4/server/api_error.h"

#include <nlohmann/json.hpp>

namespace dsv4::server {

using Json = nlohmann::ordered_json;  // the keys in the order OpenAI sends them

std::string ApiError::body() const {
  Json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  // Messages may quote request bytes; replace rather than throw on anything odd.
  return Json{{"error", e}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void throw_bad_request(std::string param, std::string code, std::string message) {
  throw ApiException(ApiError{400, "invalid_request_error", std::move(message), std::move(param), std::move(code)});
}

ApiError not_found_error(std::string message, std::string code) {
  return ApiError{404, "invalid_request_error", std::move(message), "", std::move(code)};
}

ApiError server_error(std::string message) { return ApiError{500, "server_error", std::move(message), "", ""}; }

}  // namespace dsv4::server
