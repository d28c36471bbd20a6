// Notices that the client of a request has gone away while its handler waits for the engine.
// httplib hands handlers no socket, so the socket is found by its address pair among this
// process's descriptors; it stays valid until the handler returns (httplib closes it after).
// Streaming responses do not need this: their DataSink reports a closed peer itself.
#pragma once

#include <optional>
#include <string>

namespace dsv4::server {

class PeerSocket {
 public:
  // The connected TCP socket local_addr:local_port <- remote_addr:remote_port, if any.
  static std::optional<PeerSocket> find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                        int remote_port);
  // True once the peer has closed or reset the connection (pending request bytes from a
  // pipelining client do not count).
  bool peer_closed() const;

 private:
  explicit PeerSocket(int fd) : fd_(fd) {}
  int fd_;  // not owned
};

}  // namespace dsv4::server
