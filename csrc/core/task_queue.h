// The thread that runs a communicator's tasks one at a time, in the order they were queued.
//
// Its own object, owned by the communicator and by its thread alike, so that a task may end the
// communicator (a completion callback that destroys the process group): the thread then stops
// after that task on its own, touching nothing but this queue, and nobody joins a thread from
// itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "logging.h"

namespace pycomm {

class TaskQueue : public std::enable_shared_from_this<TaskQueue> {
 public:
  // `prefix` starts errors ("[rank r/p]"); `name` says what the tasks are, for the log.
  static std::shared_ptr<TaskQueue> start(std::string prefix, std::string name, Logger logger);
  ~TaskQueue();
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Runs `task` on the thread after every task queued before it. Called from inside one of this
  // queue's tasks (a completion callback), runs `task` at once on the calling thread. Throws
  // InvalidUsageError once stopped.
  void enqueue(std::function<void()> task);
  // For a caller that will wait anyway: runs `task` on the calling thread when nothing is queued or
  // running (so issue order holds), which saves two thread hand-offs; otherwise enqueues it.
  // Returns whether it ran here (then it is over).
  bool runOrEnqueue(std::function<void()> task);
  // Like enqueue, but never refused: once the thread is gone the task runs on the calling thread
  // (completions after a shutdown must still wake their waiters).
  void post(std::function<void()> task);
  // Waits until every queued task ran, or `timeout` passes (then returns false).
  bool drain(std::chrono::milliseconds timeout);
  // Takes no more tasks (post() still), runs those queued, then ends the thread: joined, unless
  // called from it or from inside a task running inline (the thread then ends by itself once the
  // current task returns; whoever drops the queue last joins or detaches it). Idempotent.
  void stop();
  // Whether this thread is running one of this queue's tasks (inline on a caller's thread, too).
  bool insideTask() const;
  // Whether this thread is the queue's own (inside a task or not, say while a task's captures go).
  bool onOwnThread() const { return std::this_thread::get_id() == threadId_; }

 private:
  TaskQueue(std::string prefix, std::string name, Logger logger);
  void loop();
  void runTask(const std::function<void()>& task, const char* kind);
  bool runIfNested(const std::function<void()>& task);

  const std::string prefix_;
  const std::string name_;
  const Logger logger_;
  std::mutex mutex_;
  std::condition_variable queueCv_;
  std::condition_variable idleCv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;   // a task is executing
  bool stopping_ = false;  // no more enqueue()
  bool exited_ = false;    // the thread left its loop: post() runs tasks itself
  std::mutex joinMutex_;
  std::thread thread_;
  std::thread::id threadId_;  // set once, before any task can run
};

}  // namespace pycomm
