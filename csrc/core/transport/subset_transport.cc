#include "subset_transport.h"

#include <algorithm>

#include "../error.h"

namespace pycomm::transport {

SubsetTransport::SubsetTransport(Transport& base, std::vector<int> members)
    : base_(base), members_(std::move(members)) {
  auto self = std::find(members_.begin(), members_.end(), base.rank());
  PYCOMM_CHECK(self != members_.end(), InternalError, "rank ", base.rank(), " is not in its own subset");
  rank_ = static_cast<int>(self - members_.begin());
}

}  // namespace pycomm::transport
