// Errors the HTTP API reports to clients, in the shape OpenAI's clients parse:
//   {"error": {"message": "...", "type": "...", "param": "..." | null, "code": "..." | null}}
// with a matching HTTP status. Request parsing throws ApiException; the HTTP layer turns it
// into a response, so no malformed request can reach the engine.
#pragma once

#include <exception>
#include <string>

namespace dsv4::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // "" is sent as null
  std::string code;   // "" is sent as null

  std::string body() const;  // the JSON text
};

class ApiException : public std::exception {
 public:
  explicit ApiException(ApiError e) : error_(std::move(e)) {}
  const ApiError& error() const { return error_; }
  const char* what() const noexcept override { return error_.message.c_str(); }

 private:
  ApiError error_;
};

// 400 invalid_request_error naming `param` (may be "") with `code`.
[[noreturn]] void throw_bad_request(std::string param, std::string code, std::string message);

ApiError not_found_error(std::string message, std::string code = "");
ApiError server_error(std::string message);

}  // namespace dsv4::server
