// Enum conversion (enums.h). A str argument is first compared by identity with the interned
// names (string literals in Python code are interned, so `op="sum"` costs a few pointer
// compares), then by value through the C++ parsers, whose errors list the valid names.
#include "bindings/enums.h"

#include <string>
#include <vector>

#include "collectives/algorithm_table.h"
#include "common/check.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {

// Interned Python strings for names[0..n), made once (the names known then: an allreduce
// algorithm registered later is found by value, through the parser).
struct InternedNames {
  std::vector<PyObject*> names;
  template <typename NameOf>
  InternedNames(int n, NameOf name_of) {
    for (int i = 0; i < n; ++i) names.push_back(PyUnicode_InternFromString(name_of(i)));
  }
  int find(PyObject* s) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == s) return static_cast<int>(i);
    return -1;
  }
};

std::string utf8(py::handle h) {
  Py_ssize_t len = 0;
  const char* s = PyUnicode_AsUTF8AndSize(h.ptr(), &len);
  if (!s) throw py::error_already_set();
  return std::string(s, static_cast<std::size_t>(len));
}

template <typename E, typename Count, typename NameOf, typename Parse>
E convert(py::handle h, const char* what, const char* enum_name, const char* valid, Count count,
          NameOf name_of, Parse parse) {
  static const InternedNames names(count(), name_of);
  if (PyUnicode_Check(h.ptr())) {
    const int i = names.find(h.ptr());
    return i >= 0 ? static_cast<E>(i) : parse(utf8(h));
  }
  if (py::isinstance<E>(h)) return h.cast<E>();
  throw py::type_error(detail::concat(what, " must be a str (", valid, ") or zcoll._C.", enum_name, ", got ",
                                      Py_TYPE(h.ptr())->tp_name));
}

}  // namespace

ReduceOp to_op(py::handle h) {
  return convert<ReduceOp>(
      h, "op", "ReduceOp", "sum prod min max avg band bor bxor", [] { return kNumReduceOps; },
      [](int i) { return op_name(static_cast<ReduceOp>(i)); }, parse_op);
}

Algorithm to_algorithm(py::handle h) {
  static const std::string valid = allreduce_algorithm_names();
  return convert<Algorithm>(
      h, "algorithm", "Algorithm", valid.c_str(), num_allreduce_algorithms,
      [](int i) { return algorithm_name(static_cast<Algorithm>(i)); }, parse_algorithm);
}

DType to_dtype(py::handle h) {
  return convert<DType>(
      h, "dtype", "DType",
      "float32 float64 float16 bfloat16 int8 uint8 int32 int64 bool complex32 complex64 complex128",
      [] { return kNumDTypes; }, [](int i) { return dtype_name(static_cast<DType>(i)); }, parse_dtype);
}

Compression to_compression(py::handle h) {
  return convert<Compression>(
      h, "compression kind", "Compression", "none fp16 bf16 quantize topk randomk threshold",
      [] { return kNumCompressions; },
      [](int i) { return compression_kind_name(static_cast<Compression>(i)); }, parse_compression_kind);
}

void bind_enums(py::module_& m) {
  py::enum_<DType> dtype(m, "DType", "Element types (csrc/common/dtype.h).");
  for (int i = 0; i < kNumDTypes; ++i) dtype.value(dtype_name(static_cast<DType>(i)), static_cast<DType>(i));
  py::enum_<ReduceOp> op(m, "ReduceOp", "Reduction operations (csrc/common/dtype.h).");
  for (int i = 0; i < kNumReduceOps; ++i)
    op.value(op_name(static_cast<ReduceOp>(i)), static_cast<ReduceOp>(i));
  py::enum_<Algorithm> algorithm(m, "Algorithm", "Allreduce algorithms (csrc/collectives/options.h).");
  for (int i = 0; i < num_allreduce_algorithms(); ++i)
    algorithm.value(algorithm_name(static_cast<Algorithm>(i)), static_cast<Algorithm>(i));
  py::enum_<Compression> compression(m, "Compression",
                                     "Compressed wire formats (csrc/collectives/compression.h).");
  for (int i = 0; i < kNumCompressions; ++i)
    compression.value(compression_kind_name(static_cast<Compression>(i)), static_cast<Compression>(i));
  m.def("dtype_size", [](py::handle d) { return dtype_size(to_dtype(d)); }, py::arg("dtype"));
}

}  // namespace zcoll::bindings
