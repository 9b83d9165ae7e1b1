// Everything a communicator is told when it is created. The Python layer fills it from
// pycomm.Options and the environment; the core never reads the environment itself.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "logging.h"

namespace pycomm {

enum class Algorithm { kAuto, kRing };

struct Config {
  int rank = 0;
  int size = 1;
  std::string groupName;
  std::chrono::milliseconds timeout{300000};
  // Address to listen on; the adapter resolves it from the interface or the rendezvous host.
  std::string bindHost = "127.0.0.1";
  Algorithm algorithm = Algorithm::kAuto;
  // Pipelining grain: large ops are cut into chunks of this many bytes (measured default).
  size_t chunkBytes = 512 * 1024;
  LogLevel logLevel = LogLevel::kWarn;
};

const char* algorithmName(Algorithm algorithm);

}  // namespace pycomm
