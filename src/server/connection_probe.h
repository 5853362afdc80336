// Detects a client that closed its connection while its request is still generating (ST1, ST2).
// cpp-httplib 0.11 gives handlers no socket, and a non-streaming handler writes nothing until the
// answer is ready, so the probe finds the connection's descriptor once (the socket whose peer and
// local addresses equal the request's) and then polls it for a hang-up. The descriptor stays open
// for as long as the handler runs, because the HTTP worker that owns it is the one running it.
#pragma once

#include <string>

namespace ds::server {

class ConnectionProbe {
 public:
  // Finds the socket of the connection (remote/local address and port as the request reports
  // them). When none is found, closed() always answers false (writes still detect the close).
  ConnectionProbe(const std::string& remote_addr, int remote_port, const std::string& local_addr,
                  int local_port);
  bool found() const { return fd_ >= 0; }
  // True when the peer has closed or reset the connection.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace ds::server
