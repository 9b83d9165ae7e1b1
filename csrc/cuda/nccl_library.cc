#include "nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace pycomm::cuda {

void NcclLibrary::Closer::operator()(void* handle) const {
  if (handle != nullptr) dlclose(handle);
}

template <typename Fn>
void NcclLibrary::resolve(Fn*& fn, const char* name) {
  void* symbol = dlsym(handle_.get(), name);
  PYCOMM_CHECK(symbol != nullptr, Error, "NCCL library ", path_, " has no symbol ", name);
  fn = reinterpret_cast<Fn*>(symbol);
}

NcclLibrary::NcclLibrary(std::unique_ptr<void, Closer> handle, std::string path)
    : handle_(std::move(handle)), path_(std::move(path)) {
  resolve(getUniqueId, "ncclGetUniqueId");
  resolve(commInitRank, "ncclCommInitRank");
  resolve(commDestroy, "ncclCommDestroy");
  resolve(commAbort, "ncclCommAbort");
  resolve(commGetAsyncError, "ncclCommGetAsyncError");
  resolve(send, "ncclSend");
  resolve(recv, "ncclRecv");
  resolve(groupStart, "ncclGroupStart");
  resolve(groupEnd, "ncclGroupEnd");
  resolve(getErrorString, "ncclGetErrorString");
  int (*getVersion)(int*) = nullptr;
  resolve(getVersion, "ncclGetVersion");
  check(getVersion(&version_), "ncclGetVersion");
  // Point-to-point (ncclSend/ncclRecv) came in 2.7.
  PYCOMM_CHECK(version_ >= 2700, Error, "NCCL library ", path_, " is version ", version_,
               "; pycomm needs 2.7 or later");
}

const NcclLibrary& NcclLibrary::load(const std::string& path) {
  // Loaded once: a process uses one NCCL, whichever group asks first.
  static std::mutex mutex;
  static std::unique_ptr<NcclLibrary> library;
  std::lock_guard<std::mutex> lock(mutex);
  if (library) return *library;
  std::string name = path;
  if (name.empty()) {
    const char* fromEnv = std::getenv("PYCOMM_NCCL_LIBRARY");
    name = fromEnv != nullptr && *fromEnv != '\0' ? fromEnv : "libnccl.so.2";
  }
  std::unique_ptr<void, Closer> handle(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (!handle) {
    const char* reason = dlerror();
    throw Error(strCat("cannot load the NCCL library ", name, ": ", reason != nullptr ? reason : "unknown reason",
                       " (set PYCOMM_NCCL_LIBRARY to its path)"));
  }
  library = std::make_unique<NcclLibrary>(std::move(handle), name);
  return *library;
}

void NcclLibrary::check(int result, const std::string& what) const {
  if (result == kNcclSuccess) return;
  const char* text = getErrorString != nullptr ? getErrorString(result) : nullptr;
  throw Error(strCat(what, ": NCCL error ", result, " (", text != nullptr ? text : "no description", ")"));
}

}  // namespace pycomm::cuda
