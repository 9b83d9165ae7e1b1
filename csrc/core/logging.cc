#include "logging.h"

#include <cstdio>

namespace pycomm {

void Logger::log(LogLevel level, const std::string& message) const {
  if (!enabled(level)) return;
  static const char* const kNames[] = {"WARN", "INFO", "TRACE"};
  // One fprintf per line so lines from several threads do not interleave mid-line.
  std::fprintf(stderr, "[pycomm %s]%s %s\n", kNames[static_cast<int>(level)], prefix_.c_str(),
               message.c_str());
}

}  // namespace pycomm
