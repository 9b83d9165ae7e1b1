#include "completion.h"

namespace pycomm::transport::tcp {
namespace {

// Inside input handling on this thread: where finish() puts completions, and the connection read.
thread_local Completions* deferredCompletions = nullptr;
thread_local const Connection* inputConnection = nullptr;

}  // namespace

InputScope::InputScope(Completions* sink, const Connection* connection)
    : outerSink_(deferredCompletions), outerConnection_(inputConnection) {
  deferredCompletions = sink;
  inputConnection = connection;
}

InputScope::~InputScope() {
  deferredCompletions = outerSink_;
  inputConnection = outerConnection_;
}

Completions* InputScope::deferred() { return deferredCompletions; }

const Connection* InputScope::connection() { return inputConnection; }

void finish(Completions& completions) {
  if (deferredCompletions != nullptr && deferredCompletions != &completions) {
    for (auto& c : completions) deferredCompletions->push_back(std::move(c));
    completions.clear();
    return;
  }
  // Every request completes even if a callback throws (its requests are no longer posted anywhere,
  // so nothing else would); the first exception goes on afterwards.
  std::exception_ptr thrown;
  for (auto& c : completions) {
    try {
      if (c.error) {
        c.request->fail(c.error);
      } else {
        c.request->complete(c.peer);
      }
    } catch (...) {
      if (!thrown) thrown = std::current_exception();
    }
  }
  completions.clear();
  if (thrown) std::rethrow_exception(thrown);
}

}  // namespace pycomm::transport::tcp
