// Collectives on raw addresses. Python validated the buffers (contiguous, writable, sizes and
// dtypes); the C++ entry points validate op/dtype/root again and raise ValueError.
#include <cstdint>

#include "bindings.h"
#include "collectives/options.h"
#include "comm/mpi_communicator.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {

void* ptr(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

PipelineOptions pipeline(std::size_t segment_bytes, int depth) { return PipelineOptions{segment_bytes, depth}; }

}  // namespace

void bind_collectives(py::module_& m) {
  auto release = py::call_guard<py::gil_scoped_release>();
  m.def(
      "allreduce",
      [](MpiCommunicator& c, std::uintptr_t in, std::uintptr_t out, std::size_t count, int dtype, int op,
         int algorithm, std::size_t segment_bytes, int depth, bool check) {
        AllreduceOptions o;
        o.op = static_cast<ReduceOp>(op);
        o.algorithm = static_cast<Algorithm>(algorithm);
        o.pipeline = pipeline(segment_bytes, depth);
        o.check_args = check;
        return static_cast<int>(allreduce(c, ptr(in), ptr(out), count, static_cast<DType>(dtype), o));
      },
      py::arg("comm"), py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("algorithm"), py::arg("segment_bytes") = 0, py::arg("depth") = 0, py::arg("check") = false, release);
  m.def(
      "reduce_scatter",
      [](MpiCommunicator& c, std::uintptr_t in, std::uintptr_t out, std::size_t count, int dtype, int op,
         std::size_t segment_bytes, int depth, bool check) {
        ReduceOptions o;
        o.op = static_cast<ReduceOp>(op);
        o.pipeline = pipeline(segment_bytes, depth);
        o.check_args = check;
        reduce_scatter(c, ptr(in), ptr(out), count, static_cast<DType>(dtype), o);
      },
      py::arg("comm"), py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("segment_bytes") = 0, py::arg("depth") = 0, py::arg("check") = false, release);
  m.def(
      "allgather",
      [](MpiCommunicator& c, std::uintptr_t in, std::uintptr_t out, std::size_t count, int dtype,
         std::size_t segment_bytes, int depth, bool check) {
        CollectiveOptions o;
        o.pipeline = pipeline(segment_bytes, depth);
        o.check_args = check;
        allgather(c, ptr(in), ptr(out), count, static_cast<DType>(dtype), o);
      },
      py::arg("comm"), py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"),
      py::arg("segment_bytes") = 0, py::arg("depth") = 0, py::arg("check") = false, release);
  m.def(
      "broadcast",
      [](MpiCommunicator& c, std::uintptr_t buf, std::size_t count, int dtype, int root, std::size_t segment_bytes,
         int depth, bool check) {
        CollectiveOptions o;
        o.root = root;
        o.pipeline = pipeline(segment_bytes, depth);
        o.check_args = check;
        broadcast(c, ptr(buf), count, static_cast<DType>(dtype), o);
      },
      py::arg("comm"), py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("root"),
      py::arg("segment_bytes") = 0, py::arg("depth") = 0, py::arg("check") = false, release);
  m.def(
      "reduce",
      [](MpiCommunicator& c, std::uintptr_t in, std::uintptr_t out, std::size_t count, int dtype, int op, int root,
         std::size_t segment_bytes, int depth, bool check) {
        ReduceOptions o;
        o.op = static_cast<ReduceOp>(op);
        o.root = root;
        o.pipeline = pipeline(segment_bytes, depth);
        o.check_args = check;
        reduce(c, ptr(in), ptr(out), count, static_cast<DType>(dtype), o);
      },
      py::arg("comm"), py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("root"), py::arg("segment_bytes") = 0, py::arg("depth") = 0, py::arg("check") = false, release);
  m.def("barrier", [](MpiCommunicator& c) { barrier(c); }, py::arg("comm"), release);
  m.def("choose_allreduce_algorithm",
        [](std::size_t bytes, int ranks, bool native_fast, bool shared_memory, bool oversubscribed) {
          return algorithm_name(
              choose_allreduce_algorithm(bytes, ranks, Capabilities{native_fast, shared_memory, oversubscribed}));
        },
        py::arg("nbytes"), py::arg("ranks"), py::arg("native_fast") = true, py::arg("shared_memory") = true,
        py::arg("oversubscribed") = false);
  m.def("block_begin", &block_begin);
  m.def("block_count", &block_count);
}

}  // namespace zcoll::bindings
