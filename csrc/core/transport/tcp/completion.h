// Requests a transport found done while it held a lock, completed once it holds none: completing a
// request runs its callback, which is user code and may post, wait or abort.
//
// Input is handled with the connection's receive lock held (TcpTransport::handleInput). Inside, on
// that thread, finish() does not complete anything: it hands its completions to the input scope,
// which completes them after the lock is released, or gives them to the thread reading on its own
// behalf (the caller-read path), which completes them once it has stopped reading.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <vector>

#include "../request.h"

namespace pycomm::transport::tcp {

struct Connection;

// A request to complete (error null) or fail, once no lock is held.
struct Completion {
  std::shared_ptr<Request> request;
  int peer = -1;
  std::exception_ptr error;
};
using Completions = std::vector<Completion>;

// Completes the requests, or, inside an input scope on this thread, hands them to it for later.
// Every request completes even if a callback throws; the first exception goes on afterwards.
void finish(Completions& completions);

// While alive, this thread handles input from `connection`: finish() puts completions in `sink`.
// Scopes nest (a callback completed inside one may read another connection).
class InputScope {
 public:
  InputScope(Completions* sink, const Connection* connection);
  ~InputScope();
  InputScope(const InputScope&) = delete;
  InputScope& operator=(const InputScope&) = delete;

  // The innermost scope's sink on this thread, or null outside any scope.
  static Completions* deferred();
  // The connection this thread handles input from, or null.
  static const Connection* connection();

 private:
  Completions* const outerSink_;
  const Connection* const outerConnection_;
};

}  // namespace pycomm::transport::tcp
