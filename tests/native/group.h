// A group of Communicators in one process, ranks as threads (their setup is collective, so each is
// made on its own thread).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/communicator.h"
#include "harness.h"

namespace pycomm::testing {

// `configure` fills in what differs from Config's defaults; rank and size are set already.
inline std::vector<std::unique_ptr<Communicator>> makeGroup(int size, Store& store,
                                                            const std::function<void(int rank, Config&)>& configure) {
  std::vector<std::unique_ptr<Communicator>> comms(size);
  runRanks(size, [&](int r) {
    Config config;
    config.rank = r;
    config.size = size;
    configure(r, config);
    comms[r] = std::make_unique<Communicator>(config, store);
  });
  return comms;
}

}  // namespace pycomm::testing
