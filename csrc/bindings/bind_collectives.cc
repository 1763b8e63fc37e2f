// The collectives as methods of zcoll._C.Comm, on the caller's own objects: the Python/C++
// boundary of the hot path.
//
// pybind11 or nanobind: pybind11, as the rest of the extension (classes, enums, exception
// types). Its one measured cost on this path, the dispatcher (~170 ns for a method of four
// py::handle arguments: overload resolution, argument loaders, a call record), is avoided
// without a second binding library: the methods below are plain METH_FASTCALL methods added to
// the pybind11 class (fast_method.h, ~50 ns). They take the caller's objects and convert them
// by hand (buffers.h, enums.h), as nanobind's nb::ndarray does; typed pybind11 arguments would
// copy strings and run type casters on every call. Each method:
//   1. takes x (and out) through acquire(): dtype, contiguity, CPU, writability checked here;
//   2. converts op / algorithm / root (a str or the enum; ValueError listing the valid names);
//   3. checks out against x: dtype, element count, no partial overlap;
//   4. runs the C++ entry point (which validates op/dtype/root/algorithm again for C++ callers),
//      without the GIL when it can wait for another rank or copy long (may_block, bindings.h).
// Python (communicator.py) keeps the docstrings, keyword defaults, the allocation of `out`
// when none is given, and what is returned. Measured with bench/python_overhead.py (one rank,
// 4 bytes, out given, a shared and loaded 2-core machine): ~0.25 us over the C++ call for
// numpy, ~0.9 us for torch (ten attribute calls on the two tensors), mpi4py ~0.8 us in all.
#include <pybind11/stl.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "bindings.h"
#include "bindings/buffers.h"
#include "bindings/enums.h"
#include "bindings/fast_method.h"
#include "collectives/algorithm_table.h"
#include "collectives/options.h"
#include "common/check.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {

// A root rank: a Python int or anything with __index__ (numpy integers), not a bool. Its range
// is checked by the C++ entry point, which names the ranks; values beyond int fail here.
int to_root(py::handle h, int size) {
  PyObject* o = h.ptr();
  if (PyBool_Check(o) || !PyIndex_Check(o))
    throw std::invalid_argument(detail::concat("root must be an int (a rank in 0..", size - 1, "), got ",
                                               Py_TYPE(o)->tp_name));
  PyObject* index = PyNumber_Index(o);  // a new reference, or null (numpy's bool refuses)
  int overflow = 0;
  const long long v = index ? PyLong_AsLongLongAndOverflow(index, &overflow) : 0;
  Py_XDECREF(index);
  if (!index) PyErr_Clear();
  if (!index || overflow || v < INT_MIN || v > INT_MAX)
    throw std::invalid_argument(detail::concat("root ", py::repr(h).cast<std::string>(), " out of range for ",
                                               size, " ranks (valid: an int in 0..", size - 1, ")"));
  return static_cast<int>(v);
}

// _allreduce(x, out, op, algorithm)
void allreduce_method(CommHandle& self, PyObject* const* args) {
  const py::handle x = args[0], out = args[1], op = args[2], algorithm = args[3];
  MpiCommunicator& c = self.comm();
  InOut b = take_in(x, out);
  AllreduceOptions o;
  o.op = to_op(op);
  validate_op(b.in.dtype(), o.op);
  o.algorithm = to_algorithm(algorithm);
  take_out(b, out, b.in.count(), 0, "out=x");
  o.pipeline = self.pipeline;
  o.check_args = self.check;
  MaybeReleaseGil gil(may_block(c, b.in.nbytes()));
  allreduce(c, b.in.data(), b.result().data(), b.in.count(), b.in.dtype(), o);
}

// _reduce_scatter(x, out, op)
void reduce_scatter_method(CommHandle& self, PyObject* const* args) {
  const py::handle x = args[0], out = args[1], op = args[2];
  MpiCommunicator& c = self.comm();
  InOut b = take_in(x, out);
  ReduceOptions o;
  o.op = to_op(op);
  validate_op(b.in.dtype(), o.op);
  const std::size_t begin = block_begin(b.in.count(), c.size(), c.rank());
  const auto offset = -static_cast<std::ptrdiff_t>(begin * dtype_size(b.in.dtype()));
  take_out(b, out, block_count(b.in.count(), c.size(), c.rank()), offset, "out = this rank's block of x");
  o.pipeline = self.pipeline;
  o.check_args = self.check;
  MaybeReleaseGil gil(may_block(c, b.in.nbytes()));
  reduce_scatter(c, b.in.data(), b.result().data(), b.in.count(), b.in.dtype(), o);
}

// _allgather(x, out)
void allgather_method(CommHandle& self, PyObject* const* args) {
  const py::handle x = args[0], out = args[1];
  MpiCommunicator& c = self.comm();
  InOut b = take_in(x, out);
  const auto offset = static_cast<std::ptrdiff_t>(b.in.nbytes()) * c.rank();
  take_out(b, out, b.in.count() * static_cast<std::size_t>(c.size()), offset, "x = out[rank]");
  CollectiveOptions o;
  o.pipeline = self.pipeline;
  o.check_args = self.check;
  MaybeReleaseGil gil(may_block(c, b.in.nbytes() * c.size()));
  allgather(c, b.in.data(), b.result().data(), b.in.count(), b.in.dtype(), o);
}

// _broadcast(x, root)
void broadcast_method(CommHandle& self, PyObject* const* args) {
  const py::handle x = args[0], root = args[1];
  MpiCommunicator& c = self.comm();
  CollectiveOptions o;
  o.root = to_root(root, c.size());
  Buffer buf = acquire(x, "x", Access::kWrite);
  o.pipeline = self.pipeline;
  o.check_args = self.check;
  MaybeReleaseGil gil(may_block(c, buf.nbytes()));
  broadcast(c, buf.data(), buf.count(), buf.dtype(), o);
}

// _reduce(x, out, root, op). out: required on the root, optional elsewhere (checked when given,
// so that a bad out raises on every rank, not on the root alone while the others enter the
// collective).
void reduce_method(CommHandle& self, PyObject* const* args) {
  const py::handle x = args[0], out = args[1], root = args[2], op = args[3];
  MpiCommunicator& c = self.comm();
  ReduceOptions o;
  o.root = to_root(root, c.size());
  InOut b = take_in(x, out);
  o.op = to_op(op);
  validate_op(b.in.dtype(), o.op);
  if (!out.is_none()) take_out(b, out, b.in.count(), 0, "out=x");
  void* dst = c.rank() == o.root ? b.result().data() : nullptr;
  ZCOLL_REQUIRE(c.rank() != o.root || b.same || !out.is_none(),
                "out: reduce needs an output on the root rank");
  o.pipeline = self.pipeline;
  o.check_args = self.check;
  MaybeReleaseGil gil(may_block(c, b.in.nbytes()));
  reduce(c, b.in.data(), dst, b.in.count(), b.in.dtype(), o);
}

// The C++ allreduce alone, `iters` times on buffers of n elements (for bench/python_overhead.py,
// timed in the same process as the Python calls): per-call seconds.
std::vector<double> time_allreduce(CommHandle& self, std::size_t n, py::handle dtype, py::handle algorithm,
                                   int iters) {
  MpiCommunicator& c = self.comm();
  const DType d = to_dtype(dtype);
  AllreduceOptions o;
  o.algorithm = to_algorithm(algorithm);
  o.pipeline = self.pipeline;
  o.check_args = self.check;
  ZCOLL_REQUIRE(iters > 0, "iters must be positive, got ", iters);
  std::vector<unsigned char> in(n * dtype_size(d)), out(in.size());
  std::vector<double> seconds(static_cast<std::size_t>(iters));
  py::gil_scoped_release release;
  for (double& s : seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    allreduce(c, in.data(), out.data(), n, d, o);
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return seconds;
}

// zcoll._C.allreduce_algorithms(): the descriptor table (algorithm_table.h) as dicts, for tools
// and docs. "cost" evaluates the algorithm's alpha-beta-gamma model (None: no model).
py::list allreduce_algorithm_table() {
  static const std::pair<Need, const char*> kNeedNames[] = {{kNeedsNativeAllreduce, "native_allreduce"},
                                                            {kNeedsSharedMemory, "shared_memory"},
                                                            {kNeedsTopology, "topology"}};
  py::list out;
  for (int code = 0; code < num_allreduce_algorithms(); ++code) {
    const AlgorithmDescriptor& d = allreduce_algorithm(static_cast<Algorithm>(code));
    py::list needs;
    for (const auto& [need, name] : kNeedNames)
      if (d.needs & need) needs.append(name);
    py::dict row;
    row["name"] = d.name;
    row["code"] = code;
    row["needs"] = py::tuple(needs);
    row["topology_order"] = d.topology_order;
    row["cost"] = py::none();
    if (d.cost) {
      const AllreduceCost cost = d.cost;
      row["cost"] = py::cpp_function(
          [cost](double nbytes, int ranks, double alpha, double beta, double gamma, int nodes,
                 double segment_bytes) {
            ZCOLL_REQUIRE(ranks >= 1 && nodes >= 1 && nodes <= ranks,
                          "cost: ranks >= nodes >= 1, not ranks=", ranks, " nodes=", nodes);
            return cost(CostQuery{nbytes, ranks, alpha, beta, gamma, nodes, segment_bytes});
          },
          py::arg("nbytes"), py::arg("ranks"), py::arg("alpha"), py::arg("beta"), py::arg("gamma"),
          py::arg("nodes") = 1, py::arg("segment_bytes") = CostQuery{}.segment_bytes,
          "Seconds the model of docs/algorithms.md predicts for nbytes per rank on `ranks` ranks (nodes: "
          "the ranks as that many nodes of ranks/nodes each; segment_bytes: the pipeline's segment).");
    }
    out.append(row);
  }
  return out;
}

}  // namespace

void bind_collectives(py::module_& m, py::class_<CommHandle>& comm) {
  static PyMethodDef methods[] = {
      {"_allreduce",
       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastcall<allreduce_method, 4>)),
       METH_FASTCALL, "_allreduce(x, out, op, algorithm): out = allreduce(x)"},
      {"_reduce_scatter",
       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastcall<reduce_scatter_method, 3>)),
       METH_FASTCALL, "_reduce_scatter(x, out, op)"},
      {"_allgather",
       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastcall<allgather_method, 2>)),
       METH_FASTCALL, "_allgather(x, out)"},
      {"_broadcast",
       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastcall<broadcast_method, 2>)),
       METH_FASTCALL, "_broadcast(x, root)"},
      {"_reduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastcall<reduce_method, 4>)),
       METH_FASTCALL, "_reduce(x, out or None, root, op)"},
  };
  for (PyMethodDef& def : methods) add_method(comm, &def);
  comm.def(
      "barrier",
      [](CommHandle& self) {
        MpiCommunicator& c = self.comm();
        py::gil_scoped_release release;
        barrier(c);
      },
      "Returns once every rank has entered the barrier.");
  m.def(
      "describe",
      [](py::handle x, const char* name) {
        const Buffer b = acquire(x, name, Access::kRead);
        const std::vector<long long> shape = b.shape();
        return py::make_tuple(dtype_name(b.dtype()), py::tuple(py::cast(shape)), b.count());
      },
      py::arg("x"), py::arg("name") = "x",
      "(dtype name, shape, element count) of an array zcoll can take; the errors of taking it.");
  m.def("time_allreduce", &time_allreduce, py::arg("comm"), py::arg("count"), py::arg("dtype") = "float32",
        py::arg("algorithm") = "auto", py::arg("iters") = 100,
        "Runs the C++ allreduce `iters` times on zeroed buffers of `count` elements; per-call seconds.");
  m.def(
      "choose_allreduce_algorithm",
      [](std::size_t bytes, int ranks, bool native_fast, bool shared_memory, bool oversubscribed,
         bool node_hierarchy, double ordered_ring_gain, int nodes, double node_link_ratio,
         double slow_node_factor) {
        // A gain above 1 exists only with measured links (Communicator.ring_gain is 1.0 without).
        const bool topology = ordered_ring_gain > 1.0;
        return algorithm_name(choose_allreduce_algorithm(
            bytes, ranks,
            Capabilities{native_fast, shared_memory, oversubscribed, node_hierarchy, ordered_ring_gain,
                         topology, nodes, node_link_ratio, slow_node_factor}));
      },
      py::arg("nbytes"), py::arg("ranks"), py::arg("native_fast") = true, py::arg("shared_memory") = true,
      py::arg("oversubscribed") = false, py::arg("node_hierarchy") = false,
      py::arg("ordered_ring_gain") = 1.0, py::arg("nodes") = 0, py::arg("node_link_ratio") = 0.0,
      py::arg("slow_node_factor") = 0.0);
  m.def(
      "allreduce_algorithms", &allreduce_algorithm_table,
      "The allreduce algorithms, one dict each in code order: name, code, needs (what the communicator must "
      "offer), topology_order, cost (a function (nbytes, ranks, alpha, beta, gamma, nodes=1, "
      "segment_bytes=131072) -> seconds, or None).");
  m.def("block_begin", &block_begin);
  m.def("block_count", &block_count);
}

}  // namespace zcoll::bindings
