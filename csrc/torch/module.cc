// The Python extension pycomm._C: the backend class (a c10d Backend, so torch can wrap it in a
// ProcessGroup) and the few helpers the Python layer needs to fill a Config.
#include <torch/csrc/utils/pybind.h>

#include "backend.h"
#include "core/transport/tcp/socket.h"

namespace py = pybind11;
using pycomm::Config;
using pycomm::torch_adapter::PycommBackend;

namespace {

pycomm::Algorithm parseAlgorithm(const std::string& name) {
  if (name == "auto") return pycomm::Algorithm::kAuto;
  if (name == "ring") return pycomm::Algorithm::kRing;
  throw py::value_error("unknown algorithm '" + name + "' (valid: auto, ring)");
}

pycomm::LogLevel parseLogLevel(const std::string& name) {
  if (name == "WARN") return pycomm::LogLevel::kWarn;
  if (name == "INFO") return pycomm::LogLevel::kInfo;
  if (name == "TRACE") return pycomm::LogLevel::kTrace;
  throw py::value_error("unknown debug level '" + name + "' (valid: WARN, INFO, TRACE)");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pycomm's native core and its torch.distributed backend";

  py::class_<PycommBackend, ::c10d::Backend, c10::intrusive_ptr<PycommBackend>>(m, "PycommBackend")
      .def(py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       int64_t timeoutMs, const std::string& groupName, const std::string& bindHost,
                       const std::string& algorithm, int64_t chunkBytes, const std::string& debug) {
             Config config;
             config.rank = rank;
             config.size = size;
             config.timeout = std::chrono::milliseconds(timeoutMs);
             config.groupName = groupName;
             config.bindHost = bindHost;
             config.algorithm = parseAlgorithm(algorithm);
             config.chunkBytes = static_cast<size_t>(chunkBytes);
             config.logLevel = parseLogLevel(debug);
             // Connecting waits for every rank; other Python threads keep running meanwhile.
             py::gil_scoped_release release;
             return c10::make_intrusive<PycommBackend>(store, config);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"),
           py::arg("group_name"), py::arg("bind_host"), py::arg("algorithm"), py::arg("chunk_bytes"),
           py::arg("debug"));

  m.def("cuda_available", [] { return false; },
        "Whether this build of pycomm was compiled with CUDA support.");
  m.def("interface_address", &pycomm::transport::tcp::interfaceAddress, py::arg("ifname"),
        "The address of a network interface, as the transport would bind to it.");
  m.def("local_address_toward", &pycomm::transport::tcp::localAddressToward, py::arg("host"),
        "The local address the kernel would use to reach host (no packet is sent).");
}
