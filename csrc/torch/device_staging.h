// Device tensors (CUDA) through the CPU transports: each op's device tensors get pinned host
// stand-ins, the op runs on those, and the results are copied back, all on a communication stream
// that is ordered after the caller's current stream. This is the path for several ranks on one GPU
// and for hosts without NCCL.
//
// Written against c10's device-generic stream, event and guard interfaces only, so it compiles in a
// CPU-only build too (where no CUDA tensor can reach it).
//
// Life of one op:
//   caller's thread: DeviceStaging(...) records an event on the caller's current stream; stage()
//     makes the host stand-ins and tells the caching allocator that the comm stream uses the
//     device tensors (recordStream), so freeing them early cannot hand their memory to another
//     tensor while copies are queued.
//   worker (ops run one at a time, in issue order): copyIn() makes the comm stream wait for that
//     event, queues device-to-host copies, and waits for them; the op runs on the host tensors;
//     copyOut() queues the host-to-device copies and records `done`.
//   caller's wait(): its current stream waits for `done` (the host does not wait for the copies).
// Copies are queued by the worker, not the caller, so a collective reads what the collectives
// issued before it wrote, as with one stream, even if the caller did not wait for them.
// Sends and receives are posted at issue, as on the CPU path: a send's copyIn runs on the caller's
// thread (which waits for its stream), a receive's copyOut on whichever thread completes it (the
// transport's, or one waiting for another request); like CPU ones they read or write at issue, so
// a send of a tensor an earlier async op writes must wait for that op first.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <vector>

namespace pycomm::torch_adapter {

class DeviceStaging {
 public:
  // On the caller's thread. `stream` is the group's communication stream on `device`.
  DeviceStaging(c10::Device device, c10::Stream stream);
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // A contiguous pinned host tensor shaped like `deviceTensor`; `read`: filled from it by copyIn,
  // `write`: copied back to it by copyOut.
  at::Tensor stage(const at::Tensor& deviceTensor, bool read, bool write);
  // A device tensor the op uses on the communication stream directly (no stand-in): the caching
  // allocator is told, as for staged ones.
  void recordUse(const at::Tensor& deviceTensor);

  // On the worker, before the op: the host tensors hold the device tensors' contents.
  void copyIn();
  // On the worker, after the op: copies back are queued and `done` is recorded behind them.
  void copyOut();
  // On any thread, after copyOut: the calling thread's current stream waits for the copies back.
  void blockCurrentStream() const;

  c10::Device device() const { return device_; }
  c10::Stream stream() const { return stream_; }

 private:
  struct Entry {
    at::Tensor device;
    at::Tensor host;
    bool read;
    bool write;
  };
  const c10::Device device_;
  const c10::Stream stream_;
  c10::Event callerReady_;
  c10::Event done_;
  std::vector<Entry> entries_;
};

}  // namespace pycomm::torch_adapter
