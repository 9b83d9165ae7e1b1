#include "task_queue.h"

#include <utility>

#include "error.h"

namespace pycomm {
namespace {

// The queue whose task this thread is running, if any. A task's last act is to complete its Work,
// whose future runs the callbacks attached to it on this thread; an op a callback issues (DDP's
// PowerSGD hook issues one and waits for it) would queue behind the very task that waits for it.
thread_local const TaskQueue* runningTaskOf = nullptr;

class RunningTask {
 public:
  explicit RunningTask(const TaskQueue* queue) : previous_(std::exchange(runningTaskOf, queue)) {}
  ~RunningTask() { runningTaskOf = previous_; }
  RunningTask(const RunningTask&) = delete;
  RunningTask& operator=(const RunningTask&) = delete;

 private:
  const TaskQueue* previous_;
};

}  // namespace

TaskQueue::TaskQueue(std::string prefix, std::string name, Logger logger)
    : prefix_(std::move(prefix)), name_(std::move(name)), logger_(std::move(logger)) {}

std::shared_ptr<TaskQueue> TaskQueue::start(std::string prefix, std::string name, Logger logger) {
  std::shared_ptr<TaskQueue> queue(new TaskQueue(std::move(prefix), std::move(name), std::move(logger)));
  // The thread holds the queue too: it may outlive the communicator that stopped it from inside.
  // The id is set before the thread may run a task: loop() waits for a task, and none is queued
  // before start() returns.
  queue->thread_ = std::thread([self = queue] { self->loop(); });
  queue->threadId_ = queue->thread_.get_id();
  return queue;
}

TaskQueue::~TaskQueue() {
  // The last owner is the thread itself only after a stop() from inside, which detached it.
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      stop();
    }
  }
}

bool TaskQueue::insideTask() const { return runningTaskOf == this; }

void TaskQueue::runTask(const std::function<void()>& task, const char* kind) {
  try {
    const RunningTask running(this);
    task();
  } catch (const std::exception& e) {
    // Tasks report their errors through their Work; one escaping here is a bug worth seeing.
    logger_.warn(strCat(kind, " ", name_, " task threw: ", e.what()));
  }
}

bool TaskQueue::runIfNested(const std::function<void()>& task) {
  if (runningTaskOf != this) return false;
  // Issued from inside a task: run it now, right after the op whose completion is running this
  // thread's callbacks, before the tasks queued behind it. Every rank runs it at the same point
  // when the callback was attached right after its op was issued (see docs/ALGORITHMS.md).
  {
    std::lock_guard<std::mutex> lock(mutex_);
    PYCOMM_CHECK(!stopping_, InvalidUsageError, prefix_, " the process group was shut down");
  }
  runTask(task, "a nested");
  return true;
}

void TaskQueue::enqueue(std::function<void()> task) {
  if (runIfNested(task)) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    PYCOMM_CHECK(!stopping_, InvalidUsageError, prefix_, " the process group was shut down");
    queue_.push_back(std::move(task));
  }
  queueCv_.notify_one();
}

void TaskQueue::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!exited_) {
      queue_.push_back(std::move(task));
      queueCv_.notify_one();
      return;
    }
  }
  runTask(task, "a late");
}

bool TaskQueue::runOrEnqueue(std::function<void()> task) {
  if (runIfNested(task)) return true;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    PYCOMM_CHECK(!stopping_, InvalidUsageError, prefix_, " the process group was shut down");
    if (!queue_.empty() || running_) {
      queue_.push_back(std::move(task));
      lock.unlock();
      queueCv_.notify_one();
      return false;
    }
    running_ = true;
  }
  runTask(task, "an inline");
  bool queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
    queued = !queue_.empty();
  }
  // Wake the thread only for tasks queued behind this one: an idle thread woken for nothing costs a
  // context switch per op, a large share of a small op when ranks outnumber cores.
  if (queued) queueCv_.notify_one();
  idleCv_.notify_all();
  return true;
}

void TaskQueue::loop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // A task running inline on a caller's thread holds the turn: wait for it.
      queueCv_.wait(lock, [&] { return (stopping_ && queue_.empty()) || (!queue_.empty() && !running_); });
      if (queue_.empty()) {
        exited_ = true;
        break;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    runTask(task, "a queued");
    task = nullptr;  // what it held goes now, on this thread, before the queue is idle again
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    idleCv_.notify_all();
  }
  idleCv_.notify_all();
}

bool TaskQueue::drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return idleCv_.wait_for(lock, timeout, [&] { return queue_.empty() && !running_; });
}

void TaskQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queueCv_.notify_all();
  // From the thread itself, or from a task that runs inline (the thread may wait for its turn
  // behind it): joining would wait for ourselves. Another stop() may hold joinMutex_ already,
  // joining the thread that called this one: take neither.
  if (onOwnThread() || insideTask()) return;
  std::lock_guard<std::mutex> lock(joinMutex_);  // shutdown and abort may both stop it
  if (thread_.joinable()) thread_.join();
}

}  // namespace pycomm
