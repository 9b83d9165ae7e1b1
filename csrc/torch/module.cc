// The Python extension pycomm._C: the backend class (a c10d Backend, so torch can wrap it in a
// ProcessGroup) and the few helpers the Python layer needs to fill a Config.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <torch/csrc/utils/pybind.h>

#include "backend.h"
#include "core/algorithms/cost_model.h"
#include "core/codecs/block_codec.h"
#include "core/codecs/codec_kernels.h"
#include "core/error.h"
#include "core/transport/frame.h"
#include "core/transport/tcp/handshake.h"
#include "core/transport/tcp/socket.h"

namespace py = pybind11;
using pycomm::Config;
using pycomm::torch_adapter::PycommBackend;

namespace {

pycomm::LogLevel parseLogLevel(const std::string& name) {
  if (name == "WARN") return pycomm::LogLevel::kWarn;
  if (name == "INFO") return pycomm::LogLevel::kInfo;
  if (name == "TRACE") return pycomm::LogLevel::kTrace;
  throw py::value_error("unknown debug level '" + name + "' (valid: WARN, INFO, TRACE)");
}

template <typename T>
T required(const py::dict& config, const char* key) {
  if (!config.contains(key)) throw py::key_error(std::string("pycomm backend config lacks '") + key + "'");
  return config[key].cast<T>();
}

// The value named by the string config[key]; a ValueError listing the names otherwise.
template <typename Enum>
Enum choice(const py::dict& config, const char* key, std::initializer_list<std::pair<const char*, Enum>> options) {
  const auto value = required<std::string>(config, key);
  std::string valid;
  for (const auto& [name, e] : options) {
    if (value == name) return e;
    valid += (valid.empty() ? "" : ", ") + std::string(name);
  }
  throw py::value_error("unknown " + std::string(key) + " '" + value + "' (valid: " + valid + ")");
}

// [(up_to_bytes or -1, {algorithm: (alpha, beta)}), ...] as pycomm.tuning.load_cost_model gives;
// an empty list keeps the placeholder model.
pycomm::CostModel parseCostModel(const py::list& bands) {
  std::vector<pycomm::CostBand> parsed;
  for (const auto& item : bands) {
    auto [limit, model] = item.cast<std::pair<long long, py::dict>>();
    pycomm::CostBand band;
    band.upToBytes = limit < 0 ? SIZE_MAX : static_cast<size_t>(limit);
    auto cost = [&](const char* name, pycomm::AlgorithmCost& out) {
      // An algorithm the table has no constants for is never chosen.
      out = {std::numeric_limits<double>::infinity(), 0.0};
      if (!model.contains(name)) return;
      auto pair = model[name].cast<std::pair<double, double>>();
      out.alpha = pair.first;
      out.beta = pair.second;
    };
    cost("ring", band.ring);
    cost("tree", band.tree);
    cost("rhd", band.rhd);
    parsed.push_back(band);
  }
  std::stable_sort(parsed.begin(), parsed.end(), [](const auto& a, const auto& b) { return a.upToBytes < b.upToBytes; });
  pycomm::CostModel costModel;
  if (!parsed.empty()) costModel.bands = std::move(parsed);
  return costModel;
}

// One of the algorithms the cost model prices (ring, tree, rhd); auto has no schedule of its own.
pycomm::Algorithm modelledAlgorithm(const std::string& name) {
  pycomm::Algorithm algorithm;
  try {
    algorithm = pycomm::parseAlgorithm(name);
  } catch (const pycomm::InvalidUsageError& e) {
    throw py::value_error(e.what());
  }
  if (algorithm == pycomm::Algorithm::kAuto) throw py::value_error("the cost model prices ring, tree and rhd, not auto");
  return algorithm;
}

// The Python layer (pycomm/backend.py) resolves options and the environment into this dict.
Config parseConfig(int rank, int size, const py::dict& config) {
  Config c;
  c.rank = rank;
  c.size = size;
  c.timeout = std::chrono::milliseconds(required<int64_t>(config, "timeout_ms"));
  c.groupName = required<std::string>(config, "group_name");
  c.bindHost = required<std::string>(config, "bind_host");
  try {
    c.algorithm = pycomm::parseAlgorithm(required<std::string>(config, "algorithm"));
  } catch (const pycomm::InvalidUsageError& e) {
    throw py::value_error(e.what());
  }
  c.chunkBytes = required<size_t>(config, "chunk_bytes");
  c.deviceChunkBytes = required<size_t>(config, "cuda_chunk_bytes");
  c.transport = choice<pycomm::TransportKind>(config, "transport", {{"auto", pycomm::TransportKind::kAuto},
                                                                     {"tcp", pycomm::TransportKind::kTcp},
                                                                     {"shm", pycomm::TransportKind::kShm}});
  c.deviceTransport = choice<pycomm::DeviceTransport>(config, "cuda_transport",
                                                      {{"auto", pycomm::DeviceTransport::kAuto},
                                                       {"nccl", pycomm::DeviceTransport::kNccl},
                                                       {"staged", pycomm::DeviceTransport::kStaged}});
  c.hostId = required<std::string>(config, "host_id");
  c.bucketBytes = required<size_t>(config, "bucket_bytes");
  c.tcpLinger = std::chrono::milliseconds(required<int64_t>(config, "tcp_linger_ms"));
  c.unexpectedBytes = required<uint64_t>(config, "unexpected_bytes");
  c.logLevel = parseLogLevel(required<std::string>(config, "debug"));
  const auto compression = required<std::string>(config, "compression");
  if (compression != "none") {
    try {
      c.compression = pycomm::codecs::codecFromName(compression);
    } catch (const pycomm::InvalidUsageError& e) {
      throw py::value_error(e.what());
    }
  }
  c.costModel = parseCostModel(required<py::list>(config, "cost_model"));
  return c;
}

// The encoded bytes of `count` elements for codec_decode*, contiguous.
at::Tensor checkedEncoded(const char* what, const std::string& name, const at::Tensor& encoded, int64_t count) {
  TORCH_CHECK_TYPE(encoded.scalar_type() == at::kByte && encoded.device().is_cpu(), what, " needs a CPU uint8 tensor");
  const auto codec = pycomm::codecs::codecFromName(name);
  TORCH_CHECK_VALUE(count >= 0 && static_cast<size_t>(encoded.numel()) == pycomm::codecs::encodedBytes(codec, count),
                    what, ": ", encoded.numel(), " bytes do not encode ", count, " elements");
  return encoded.contiguous();
}

// An output tensor the caller passed to a codec binding: the codec writes numel elements of dtype
// straight into its storage, which must not overlap the input (block_codec.h).
void checkCodecOut(const char* what, const char* param, const at::Tensor& out, at::ScalarType dtype, int64_t numel,
                   const at::Tensor& in) {
  TORCH_CHECK_TYPE(out.scalar_type() == dtype && out.device().is_cpu(), what, ": ", param, " must be a CPU ", dtype,
                   " tensor, got ", out.scalar_type(), " on ", out.device());
  TORCH_CHECK_VALUE(out.is_contiguous(), what, ": ", param, " must be contiguous");
  TORCH_CHECK_VALUE(out.numel() == numel, what, ": ", param, " has ", out.numel(), " elements, needs ", numel);
  const auto* outBegin = static_cast<const char*>(out.data_ptr());
  const auto* inBegin = static_cast<const char*>(in.data_ptr());
  const bool disjoint = outBegin + out.nbytes() <= inBegin || inBegin + in.nbytes() <= outBegin;
  TORCH_CHECK_VALUE(numel == 0 || in.numel() == 0 || disjoint, what, ": ", param, " overlaps the input");
}

// Seconds that `iters` calls of `op` take, with the GIL released (benchmarks/small_message_anatomy.py).
template <typename Op>
double secondsFor(int64_t iters, const Op& op) {
  const py::gil_scoped_release release;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) op();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pycomm's native core and its torch.distributed backend";

  py::class_<PycommBackend, ::c10d::Backend, c10::intrusive_ptr<PycommBackend>>(m, "PycommBackend")
      .def(py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       const py::dict& config, const PycommBackend* parent, const std::string& lineageKey,
                       const std::vector<int>& parentRanks) {
             Config parsed = parseConfig(rank, size, config);
             if (parent != nullptr) parsed.lineage = parent->lineageFor(lineageKey, rank, size, parentRanks);
             // Connecting waits for every rank; other Python threads keep running meanwhile.
             py::gil_scoped_release release;
             return c10::make_intrusive<PycommBackend>(store, parsed);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("config"), py::kw_only(),
           py::arg("parent") = nullptr, py::arg("lineage_key") = "", py::arg("parent_ranks") = std::vector<int>{},
           "A group of `size` ranks formed through `store`; one formed from `parent` (its ranks there: "
           "`parent_ranks`, `lineage_key` the same on every member) derives its secret from the parent's.")
      .def("set_algorithm", &PycommBackend::setAlgorithm, py::arg("algorithm"),
           "Use this all-reduce algorithm for the ops issued after this call.")
      // Without the GIL: a group's first CUDA op waits for the worker (the NCCL route decision),
      // whose completion callbacks may need it.
      .def("allreduce_compressed", &PycommBackend::allreduceCompressed, py::arg("tensor"), py::arg("op"),
           py::arg("codec"), py::arg("residual") = std::nullopt,
           "All-reduce a float32 tensor compressed with codec (rounding twice); residual: a float32 CPU "
           "tensor of the same size kept between calls, for error feedback.",
           py::call_guard<py::gil_scoped_release>())
      // torch binds getError for NCCL's group only: ours, as torch's ErrorType.
      .def("get_error", &PycommBackend::getError,
           "The last fault: ErrorType.TIMEOUT, COMM_ERROR (a connection lost), REMOTE_ERROR (a peer's report) or SUCCESS.")
      .def_property_readonly("shrink_depth", &PycommBackend::shrinkDepth,
                             "How many shrinks made this group from one torch created (0 for that one).")
      .def("_set_trace_group", &PycommBackend::setTraceGroup, py::arg("name"), py::arg("desc"), py::arg("global_ranks"),
           "The group's name and global ranks in the flight recorder's dumps.")
      .def_property_readonly("global_rank", &PycommBackend::globalRank,
                             "This process's rank in the default group (the dump file's suffix).")
      // benchmarks/small_message_anatomy.py: the direct all-reduce with no torch dispatch around it,
      // and the same through the backend's c10d entry (its op, Work and future).
      .def("_time_direct_all_reduce", [](PycommBackend& backend, const at::Tensor& tensor, int64_t iters) {
             return secondsFor(iters, [&] { backend.allreduceDirect(tensor, "sum"); });
           }, py::arg("tensor"), py::arg("iters"),
           "Seconds that `iters` SUM all-reduces of `tensor` take, called in a loop from C++.")
      .def("_time_work_all_reduce", [](PycommBackend& backend, const at::Tensor& tensor, int64_t iters) {
             std::vector<at::Tensor> tensors{tensor};
             ::c10d::AllreduceOptions opts;
             opts.asyncOp = false;  // as dist.all_reduce without async_op
             return secondsFor(iters, [&] {
               // No Work when the op ran here and succeeded (dispatch()), as dist.all_reduce sees.
               if (auto work = backend.allreduce(tensors, opts)) work->wait();
             });
           }, py::arg("tensor"), py::arg("iters"),
           "Seconds that `iters` SUM all-reduces of `tensor` take through PycommBackend::allreduce and, "
           "when it returns one, Work::wait, called in a loop from C++.")
      .def("failed_ranks", &PycommBackend::failedRanks,
           "The group ranks this rank lost, waited for past the timeout, or heard lost from a peer.")
      .def("stats", [](const PycommBackend& backend) {
             py::dict out;
             for (const auto& [key, s] : backend.stats()) {
               py::dict entry;
               entry["calls"] = s.calls;
               entry["bytes_sent"] = s.bytesSent;
               entry["bytes_received"] = s.bytesReceived;
               entry["seconds"] = s.seconds;
               out[py::str(key)] = entry;
             }
             return out;
           }, "Counters per op and codec since the group was created.");

  m.def("direct_all_reduce_", [](const at::Tensor& tensor, const std::string& reduceOp,
                                  const c10::intrusive_ptr<::c10d::ProcessGroup>& group) {
    py::gil_scoped_release release;
    pycomm::torch_adapter::directAllreduceEager(tensor, reduceOp, group);
  }, py::arg("tensor"), py::arg("reduce_op"), py::arg("group"),
     "torch.ops.pycomm.direct_all_reduce_(tensor, reduce_op, group.group_name), from C++ (backend.h).");
  m.def("_direct_all_reduce_calls_kernel", &pycomm::torch_adapter::dispatchesStraightToKernel, py::arg("tensor"),
        "Whether direct_all_reduce_ of `tensor`, on this thread now, calls the kernel without the dispatcher.");

  // The wire parsers, exposed so tests can fuzz them with arbitrary bytes.
  m.def("flight_recorder_dump", [](const std::string& path) {
    py::gil_scoped_release release;
    pycomm::torch_adapter::FlightRecorder::instance().dumpTo(path);
  }, py::arg("path"), "Writes the flight recorder's dump (torch's pickle format) to `path`.");
  m.def("flight_recorder_bytes", [] {
    std::string bytes;
    {
      py::gil_scoped_release release;
      bytes = pycomm::torch_adapter::FlightRecorder::instance().dump();
    }
    return py::bytes(bytes);
  }, "The flight recorder's dump as bytes (pickle.loads reads it).");
  m.def("_flight_recorder_set_recording", [](bool on) { pycomm::torch_adapter::FlightRecorder::instance().setRecording(on); },
        "Pauses or resumes the flight recorder (benchmarks/recording_overhead.py measures it so).");
  m.def("_validate_frame_header", [](const py::bytes& raw) {
          const std::string bytes = raw;
          if (bytes.size() != sizeof(pycomm::transport::FrameHeader)) {
            return std::string("header must be ") + std::to_string(sizeof(pycomm::transport::FrameHeader)) + " bytes";
          }
          pycomm::transport::FrameHeader header;
          std::memcpy(&header, bytes.data(), sizeof header);
          return pycomm::transport::validateHeader(header);
        }, py::arg("raw"), "Why a frame header is malformed, or an empty string.");
  m.def("_check_hello", [](const py::bytes& raw, const py::bytes& token, const py::bytes& nonce, int rank, int size) {
          const std::string bytes = raw, tokenBytes = token, nonceBytes = nonce;
          namespace tcp = pycomm::transport::tcp;
          if (bytes.size() != sizeof(tcp::Hello)) return std::string("hello must be ") + std::to_string(sizeof(tcp::Hello)) + " bytes";
          if (tokenBytes.size() != sizeof(tcp::Token)) return std::string("bad token size");
          if (nonceBytes.size() != sizeof(tcp::Nonce)) return std::string("bad nonce size");
          tcp::Hello hello;
          std::memcpy(&hello, bytes.data(), sizeof hello);
          tcp::Token t;
          std::memcpy(t.data(), tokenBytes.data(), t.size());
          tcp::Nonce n;
          std::memcpy(n.data(), nonceBytes.data(), n.size());
          return tcp::checkHello(hello, t, n, rank, size);
        }, py::arg("raw"), py::arg("token"), py::arg("nonce"), py::arg("rank"), py::arg("size"),
        "Why a handshake is rejected by `rank` of a group of `size` that sent the challenge `nonce`, or an empty string.");
  m.def("codec_encode", [](const std::string& name, const at::Tensor& x, std::optional<at::Tensor> out) {
          TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && x.device().is_cpu(), "codec_encode needs a CPU float32 tensor");
          const auto codec = pycomm::codecs::codecFromName(name);
          at::Tensor flat = x.contiguous().view({-1});
          const auto bytes = static_cast<int64_t>(pycomm::codecs::encodedBytes(codec, flat.numel()));
          at::Tensor encoded = out ? *out : at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
          if (out) checkCodecOut("codec_encode", "out", encoded, at::kByte, bytes, flat);
          pycomm::codecs::encode(codec, flat.data_ptr<float>(), flat.numel(), encoded.data_ptr<uint8_t>());
          return encoded;
        }, py::arg("codec"), py::arg("x"), py::arg("out") = py::none(),
        "Encode a float32 tensor (flattened) with a pycomm codec, into `out` (contiguous uint8, "
        "encodedBytes long) when given.");
  m.def("codec_decode", [](const std::string& name, const at::Tensor& encoded, int64_t count, std::optional<at::Tensor> out) {
          const at::Tensor in = checkedEncoded("codec_decode", name, encoded, count);
          const auto codec = pycomm::codecs::codecFromName(name);
          at::Tensor decoded = out ? *out : at::empty({count}, at::TensorOptions().dtype(at::kFloat));
          if (out) checkCodecOut("codec_decode", "out", decoded, at::kFloat, count, in);
          pycomm::codecs::decode(codec, in.data_ptr<uint8_t>(), count, decoded.data_ptr<float>());
          return decoded;
        }, py::arg("codec"), py::arg("encoded"), py::arg("count"), py::arg("out") = py::none(),
        "Decode what codec_encode produced, into `out` (contiguous float32, count elements) when given.");
  m.def("codec_decode_add", [](const std::string& name, const at::Tensor& encoded, const at::Tensor& acc) {
          const at::Tensor in = checkedEncoded("codec_decode_add", name, encoded, acc.numel());
          checkCodecOut("codec_decode_add", "acc", acc, at::kFloat, acc.numel(), in);
          pycomm::codecs::decodeAdd(pycomm::codecs::codecFromName(name), in.data_ptr<uint8_t>(), acc.numel(),
                                    acc.data_ptr<float>());
          return acc;
        }, py::arg("codec"), py::arg("encoded"), py::arg("acc"),
        "acc += decode(encoded) in place (the fused decode-add of the reductions); acc is a contiguous "
        "float32 tensor of the encoded element count.");

  m.def("codec_isa", [] { return std::string(pycomm::codecs::activeKernels().isa); },
        "The instruction set of the codec kernels this process uses: \"scalar\", \"avx2\" or \"avx512\" "
        "(the fastest this CPU runs, chosen when the library loads).");

#ifdef PYCOMM_WITH_CUDA
  constexpr bool kBuiltWithCuda = true;
#else
  constexpr bool kBuiltWithCuda = false;
#endif
  // The one cost model (csrc/core/algorithms/cost_model.cc), for pycomm.tuning's fitting and choice.
  m.def("model_steps", [](const std::string& algorithm, int p) {
        return pycomm::algorithms::modelSteps(modelledAlgorithm(algorithm), p);
      }, py::arg("algorithm"), py::arg("p"), "steps(p) of an all-reduce over p ranks");
  m.def("model_bytes", [](const std::string& algorithm, double n, int p) {
        return pycomm::algorithms::modelBytes(modelledAlgorithm(algorithm), n, p);
      }, py::arg("algorithm"), py::arg("n"), py::arg("p"), "bytes a rank moves in an n-byte all-reduce over p ranks");
  m.def("choose_allreduce", [](const py::list& bands, int64_t nbytes, int p) {
        if (nbytes < 0) throw py::value_error("choose_allreduce: nbytes must not be negative");
        const auto model = parseCostModel(bands);
        return std::string(pycomm::algorithmName(
            pycomm::algorithms::chooseAllreduce(model, static_cast<size_t>(nbytes), p)));
      }, py::arg("bands"), py::arg("nbytes"), py::arg("p"),
      "the algorithm auto picks for an nbytes all-reduce over p ranks, from load_cost_model's bands");
  m.def("cuda_available", [] { return kBuiltWithCuda; },
        "Whether this build of pycomm has its CUDA kernels compiled in (CUDA tensors are accepted by "
        "either build when torch has CUDA: they are staged through host memory).");
  m.def("interface_address", &pycomm::transport::tcp::interfaceAddress, py::arg("ifname"),
        "The address of a network interface, as the transport would bind to it.");
  m.def("local_address_toward", &pycomm::transport::tcp::localAddressToward, py::arg("host"),
        "The local address the kernel would use to reach host (no packet is sent).");
}
