// The compressed allreduce (collectives/compression.h) and one rank's payload
// (collectives/payload.h), for zcoll.compression:
//   CompressionOptions   the C++ struct, built and validated once in a compressor's __init__
//                        (ValueError naming the parameter); per call only op, algorithm, the
//                        seed and the residual are added
//   allreduce_compressed the collective on the caller's objects (buffers.h), stats as a dict;
//                        norm_sample per call too (the guard's sampled norms)
//   Payload              the bytes one rank would send, with the layout of its arrays (Python
//                        shows them as numpy views of these bytes) and the input's shape;
//                        encode_payload / decode_payload run the collective's own encode,
//                        selection and decode; encode_payload(..., into=payload) overwrites a
//                        payload of a tensor of the same size in place (no allocation)
#include <cstdint>

#include "bindings.h"
#include "bindings/buffers.h"
#include "bindings/enums.h"
#include "collectives/compression.h"
#include "collectives/payload.h"
#include "common/check.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {

// A payload with what it was encoded from, so that decoding can only use the same options
// and an output of the same size and dtype.
struct BoundPayload {
  WirePayload wire;
  CompressionOptions options;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  std::vector<long long> shape;
};

// Whether [a, a + an) and [b, b + bn) share a byte.
bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

CompressionOptions make_options(py::handle kind, int bits, py::handle block, bool stochastic, double ratio,
                                bool exact_topk, double threshold, bool measure_error) {
  CompressionOptions o;
  o.kind = to_compression(kind);
  o.bits = bits;
  int overflow = 0;  // beyond 64 bits: refused like any other bad block (it was an OverflowError)
  const long long b = PyLong_Check(block.ptr()) ? PyLong_AsLongLongAndOverflow(block.ptr(), &overflow) : 0;
  if (PyErr_Occurred()) throw py::error_already_set();
  ZCOLL_REQUIRE(b > 0 && !overflow, "quantization block must be a positive integer below 2^63, got ",
                py::repr(block).cast<std::string>());
  o.block = static_cast<std::size_t>(b);
  o.stochastic = stochastic;
  o.ratio = ratio;
  o.exact_topk = exact_topk;
  o.threshold = static_cast<float>(threshold);
  o.measure_error = measure_error;
  validate(o, DType::kFloat32, 0);
  return o;
}

// The residual of error feedback: float32, one element per element of x, or None.
Buffer take_residual(py::handle residual, const Buffer& x) {
  Buffer e;
  if (residual.is_none()) return e;
  e = acquire(residual, "residual", Access::kWrite);
  ZCOLL_REQUIRE(e.dtype() == DType::kFloat32 && e.count() == x.count(), "residual: expected ", x.count(),
                " float32 elements, got ", e.count(), " ", dtype_name(e.dtype()));
  return e;
}

py::dict stats_dict(const CompressionStats& s) {
  py::dict d;
  d["wire_bytes"] = s.wire_bytes;
  d["dense_bytes"] = s.dense_bytes;
  d["nonfinite"] = s.nonfinite;
  d["first_nonfinite_rank"] = s.first_nonfinite_rank;
  d["pairs"] = s.pairs;
  d["dense_fallback"] = s.dense_fallback;
  d["error_max_abs"] = s.error_max_abs;
  d["error_l2"] = s.error_l2;
  d["input_squares"] = s.input_squares;
  d["residual_squares"] = s.residual_squares;
  return d;
}

py::dict allreduce_compressed_method(CommHandle& self, py::handle x, py::handle out, py::handle op,
                                     py::handle algorithm, const CompressionOptions& options,
                                     std::uint64_t seed, py::handle residual, std::size_t norm_sample) {
  MpiCommunicator& c = self.comm();
  InOut b = take_in(x, out);
  CompressionOptions o = options;
  o.op = to_op(op);
  o.algorithm = to_algorithm(algorithm);
  o.seed = seed;
  o.norm_sample = norm_sample;
  take_out(b, out, b.in.count(), 0, "out=x");
  const Buffer e = take_residual(residual, b.in);
  o.residual = static_cast<float*>(e.data());
  o.pipeline = self.pipeline;
  o.check_args = self.check;
  CompressionStats s;
  {
    MaybeReleaseGil gil(may_block(c, b.in.nbytes()));
    allreduce_compressed(c, b.in.data(), b.result().data(), b.in.count(), b.in.dtype(), o, &s);
  }
  py::dict d = stats_dict(s);
  d["count"] = b.in.count();
  return d;
}

// `into` (a Payload or None): overwritten in place when it holds a payload of the same options,
// count and dtype with a fixed size, so the views Python keeps of its bytes stay valid.
py::object encode(py::handle x, const CompressionOptions& options, std::uint64_t seed, py::handle residual,
                  py::handle into) {
  const Buffer in = acquire(x, "x", Access::kRead);
  const Buffer e = take_residual(residual, in);
  py::object result = into.is_none() ? py::cast(BoundPayload{}) : py::reinterpret_borrow<py::object>(into);
  BoundPayload& p = result.cast<BoundPayload&>();
  if (!into.is_none()) {
    const std::size_t fixed = fixed_payload_bytes(in.count(), options);
    ZCOLL_REQUIRE(fixed != 0 && p.wire.kind == options.kind && p.count == in.count() && p.dtype == in.dtype() &&
                      p.wire.bytes.size() == fixed,
                  "out: expected a payload of ", compression_name(options), " from ", in.count(), " ",
                  dtype_name(in.dtype()), " elements (out= takes fixed-size payloads: quantizers, fp16/bf16, "
                  "top-k), got one from ", p.count, " ", dtype_name(p.dtype), " elements");
    ZCOLL_REQUIRE(!overlap(in.data(), in.nbytes(), p.wire.bytes.data(), p.wire.bytes.size()) &&
                      !overlap(e.data(), e.nbytes(), p.wire.bytes.data(), p.wire.bytes.size()),
                  "out shares memory with x or the residual; pass an out of its own");
  }
  p.options = options;
  p.options.seed = seed;
  p.options.residual = static_cast<float*>(e.data());
  p.count = in.count();
  p.dtype = in.dtype();
  p.shape = in.shape();
  {
    MaybeReleaseGil gil(in.nbytes() >= kGilFreeBytes);
    encode_payload_into(p.wire, in.data(), in.count(), in.dtype(), p.options);
  }
  p.options.residual = nullptr;
  return result;
}

std::size_t decode(const BoundPayload& p, py::handle out) {
  const Buffer y = acquire(out, "out", Access::kWrite);
  ZCOLL_REQUIRE(y.dtype() == p.dtype && y.count() == p.count, "out: expected ", p.count, " ",
                dtype_name(p.dtype), " elements, got ", y.count(), " ", dtype_name(y.dtype()));
  // The payload's arrays are numpy views of its bytes: decoding into one would overwrite what
  // is still to be read (found by tests/mpi/fuzz.py).
  const auto wire = reinterpret_cast<std::uintptr_t>(p.wire.bytes.data());
  const auto dst = reinterpret_cast<std::uintptr_t>(y.data());
  ZCOLL_REQUIRE(y.nbytes() == 0 || dst + y.nbytes() <= wire || wire + p.wire.bytes.size() <= dst,
                "out shares memory with the payload being decoded; pass an out of its own");
  MaybeReleaseGil gil(y.nbytes() >= kGilFreeBytes);
  return decode_payload(p.wire, p.count, p.dtype, p.options, y.data());
}

}  // namespace

void bind_compressed(py::module_& m) {
  py::class_<CompressionOptions>(m, "CompressionOptions",
                                 "The options of a compressed allreduce (csrc/collectives/compression.h), "
                                 "validated on construction.")
      .def(py::init(&make_options), py::arg("kind"), py::kw_only(), py::arg("bits") = 8,
           py::arg("block") = 256, py::arg("stochastic") = false, py::arg("ratio") = 0.01,
           py::arg("exact_topk") = false, py::arg("threshold") = 0.0, py::arg("measure_error") = false)
      .def_property_readonly("kind", [](const CompressionOptions& o) { return o.kind; })
      .def_readonly("bits", &CompressionOptions::bits)
      .def_readonly("block", &CompressionOptions::block)
      .def_readonly("stochastic", &CompressionOptions::stochastic)
      .def_readonly("ratio", &CompressionOptions::ratio)
      .def_readonly("exact_topk", &CompressionOptions::exact_topk)
      .def_readonly("threshold", &CompressionOptions::threshold)
      .def_readonly("measure_error", &CompressionOptions::measure_error)
      .def("__repr__", [](const CompressionOptions& o) {
        return "<CompressionOptions " + compression_name(o) + (o.measure_error ? " measure_error" : "") + ">";
      });

  py::class_<BoundPayload>(m, "Payload", py::buffer_protocol(),
                           "One rank's compressed payload: its bytes (buffer protocol) and arrays.")
      .def_buffer([](BoundPayload& p) {
        return py::buffer_info(p.wire.bytes.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {p.wire.bytes.size()}, {1});
      })
      .def_property_readonly("nonfinite", [](const BoundPayload& p) { return p.wire.nonfinite; })
      .def_property_readonly("count", [](const BoundPayload& p) { return p.count; })
      .def_property_readonly("dtype", [](const BoundPayload& p) { return dtype_name(p.dtype); })
      .def_property_readonly(
          "shape",
          [](const BoundPayload& p) {
            py::tuple t(p.shape.size());
            for (std::size_t i = 0; i < p.shape.size(); ++i) t[i] = py::int_(p.shape[i]);
            return t;
          },
          "The input's shape.")
      .def_property_readonly(
          "layout",
          [](const BoundPayload& p) {
            py::list l;
            for (const PayloadArray& a : p.wire.arrays)
              l.append(py::make_tuple(a.name, a.type, a.offset, a.count));
            return l;
          },
          "[(name, numpy type, byte offset, count)] of the arrays in the bytes.");

  m.def("allreduce_compressed", &allreduce_compressed_method, py::arg("comm"), py::arg("x"), py::arg("out"),
        py::arg("op"), py::arg("algorithm"), py::arg("options"), py::arg("seed"), py::arg("residual"),
        py::arg("norm_sample") = 0,
        "out = sum (or avg) of x over the ranks through options' wire format; returns the stats as a dict.");
  m.def("encode_payload", &encode, py::arg("x"), py::arg("options"), py::arg("seed"), py::arg("residual"),
        py::arg("into") = py::none(),
        "One rank's payload of x (the hop-0 encode / selection of the collective; the residual is updated), "
        "written into `into` (a payload of the same size, returned) when given.");
  m.def("decode_payload", &decode, py::arg("payload"), py::arg("out"),
        "out = the tensor the payload stands for; returns the payload's non-finite count.");
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
