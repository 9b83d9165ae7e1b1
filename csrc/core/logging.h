// Leveled logging to stderr with the group's context in front of every line. The level comes from
// the communicator's configuration (the Python layer reads PYCOMM_DEBUG), never from getenv here.
#pragma once

#include <string>

namespace pycomm {

enum class LogLevel : int { kWarn = 0, kInfo = 1, kTrace = 2 };

class Logger {
 public:
  Logger() = default;
  Logger(LogLevel level, std::string prefix) : level_(level), prefix_(std::move(prefix)) {}
  bool enabled(LogLevel level) const { return static_cast<int>(level) <= static_cast<int>(level_); }
  void log(LogLevel level, const std::string& message) const;
  void warn(const std::string& message) const { log(LogLevel::kWarn, message); }

 private:
  LogLevel level_ = LogLevel::kWarn;
  std::string prefix_;
};

}  // namespace pycomm
