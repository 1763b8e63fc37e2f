// The compressed allreduce (collectives/compression.h) on raw addresses, for zcoll.compression.
// Python validated the buffers (sizes, dtypes, the residual's length); C++ validates the
// options (ValueError). The GIL is released during the collective.
#include <cstdint>

#include "bindings.h"
#include "collectives/compression.h"
#include "comm/mpi_communicator.h"

namespace py = pybind11;

namespace zcoll::bindings {

void bind_compressed(py::module_& m) {
  m.def(
      "allreduce_compressed",
      [](MpiCommunicator& c, std::uintptr_t in, std::uintptr_t out, std::size_t count, int dtype, int op,
         int kind, int bits, std::size_t block, bool stochastic, std::uint64_t seed, double ratio,
         bool exact_topk, float threshold, std::uintptr_t residual, bool measure_error,
         std::size_t segment_bytes, int depth, bool check) {
        CompressionOptions o;
        o.kind = static_cast<Compression>(kind);
        o.op = static_cast<ReduceOp>(op);
        o.bits = bits;
        o.block = block;
        o.stochastic = stochastic;
        o.seed = seed;
        o.ratio = ratio;
        o.exact_topk = exact_topk;
        o.threshold = threshold;
        o.residual = reinterpret_cast<float*>(residual);
        o.measure_error = measure_error;
        o.pipeline = PipelineOptions{segment_bytes, depth};
        o.check_args = check;
        CompressionStats s;
        {
          py::gil_scoped_release release;
          allreduce_compressed(c, reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), count,
                               static_cast<DType>(dtype), o, &s);
        }
        py::dict d;
        d["wire_bytes"] = s.wire_bytes;
        d["dense_bytes"] = s.dense_bytes;
        d["nonfinite"] = s.nonfinite;
        d["first_nonfinite_rank"] = s.first_nonfinite_rank;
        d["pairs"] = s.pairs;
        d["dense_fallback"] = s.dense_fallback;
        d["error_max_abs"] = s.error_max_abs;
        d["error_l2"] = s.error_l2;
        return d;
      },
      py::arg("comm"), py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("kind"), py::arg("bits") = 8, py::arg("block") = 256, py::arg("stochastic") = false,
      py::arg("seed") = 0, py::arg("ratio") = 0.01, py::arg("exact_topk") = false,
      py::arg("threshold") = 0.0f, py::arg("residual") = 0, py::arg("measure_error") = false,
      py::arg("segment_bytes") = 0, py::arg("depth") = 0, py::arg("check") = false);
  m.def("sparse_k", &sparse_k, py::arg("count"), py::arg("ratio"));
  m.def("topk_segments", &topk_segments, py::arg("count"), py::arg("exact") = false);
  m.def(
      "compression_error_bound",
      [](const std::string& spec, int p, double A, double M) {
        return compression_error_bound(parse_compression(spec), p, A, M);
      },
      py::arg("spec"), py::arg("p"), py::arg("A"), py::arg("M"));
}

}  // namespace zcoll::bindings
