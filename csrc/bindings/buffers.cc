// Buffer acquisition (buffers.h). Four sources, tried in this order:
//   numpy    an ndarray (or subclass): data, dims, flags and the dtype's type character read
//            from numpy's own structs (their first fields are the same in numpy 1.x and 2.x);
//            about 20 ns, against 8 us for __array_interface__ in Python.
//   torch    a torch.Tensor, once torch is in sys.modules (never imported here): five calls
//            (dtype, is_cpu, is_contiguous(), data_ptr(), numel()), about 0.3 us in all, the
//            cheapest of the ways measured (__dlpack__ costs ~2 us, torch's own C++ headers
//            are not available to this build); dtype compared by identity with 12 cached objects.
//   DLPack   obj.__dlpack__(max_version=(1, 0)) (without arguments for producers that refuse
//            it): a "dltensor_versioned" capsule (with the read-only flag) or a legacy
//            "dltensor" one, renamed "used_..." as the protocol requires; the deleter runs when
//            the Buffer dies.
//   buffer   PyObject_GetBuffer: format characters with '@' (native sizes), '=', '<' (standard
//            sizes) or no prefix; integers by their item size; '?' bool, 'Zf' / 'Zd' complex.
// Dtypes: the eight numeric ones, bool (numpy '?', torch.bool, DLPack kDLBool) and complex32 /
// complex64 / complex128 (torch's three, numpy's two, DLPack kDLComplex by total bits).
// Errors keep the wording of the former Python adapter (docs/errors.md) and name the argument.
#include "bindings/buffers.h"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/check.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {

// ---- numpy's structs: the leading fields, stable across numpy 1.x and 2.x ----------------
struct NumpyArray {
  PyObject ob_base;  // PyObject_HEAD
  char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  PyObject* descr;
  int flags;
};
struct NumpyDescr {
  PyObject ob_base;  // PyObject_HEAD
  PyTypeObject* typeobj;
  char kind;
  char type;
  char byteorder;
};
constexpr int kNumpyCContiguous = 0x0001;
constexpr int kNumpyWriteable = 0x0400;

// ---- DLPack (dlpack.h 1.0): only the parts read here --------------------------------------
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  std::uint64_t flags;
  DLTensor dl_tensor;
};
constexpr std::uint64_t kDLFlagReadOnly = 1;
constexpr std::int32_t kDLCPU = 1, kDLCUDAHost = 3;  // memory the CPU can address
constexpr std::uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6;

const char* const kValidDTypes =
    "float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool, complex32, complex64, complex128";

[[noreturn]] void fail(const char* name, const std::string& what) {
  throw std::invalid_argument(detail::concat(name, ": ", what));
}

std::string str_of(py::handle h) { return py::str(h).cast<std::string>(); }

[[noreturn]] void fail_dtype(const char* name, const std::string& dtype) {
  fail(name, "unsupported dtype " + dtype + "; valid: " + kValidDTypes);
}

// A new reference from `module` in sys.modules, or null when it is not imported.
PyObject* imported_attr(const char* module, const char* attr) {
  PyObject* mod = PyDict_GetItemString(PyImport_GetModuleDict(), module);  // borrowed
  if (!mod) return nullptr;
  PyObject* a = PyObject_GetAttrString(mod, attr);
  if (!a) PyErr_Clear();
  return a;
}

// ---- numpy -------------------------------------------------------------------------------
PyTypeObject* numpy_ndarray() {
  static PyObject* type = nullptr;  // cached for the process once numpy is imported
  if (!type) type = imported_attr("numpy", "ndarray");
  return reinterpret_cast<PyTypeObject*>(type);
}

bool parse_numpy_type(char type, DType& out) {
  switch (type) {
    case 'f':
      out = DType::kFloat32;
      return true;
    case 'd':
      out = DType::kFloat64;
      return true;
    case 'e':
      out = DType::kFloat16;
      return true;
    case 'b':
      out = DType::kInt8;
      return true;
    case 'B':
      out = DType::kUInt8;
      return true;
    case 'i':
      out = sizeof(int) == 4 ? DType::kInt32 : DType::kInt64;
      return true;
    case 'l':
      out = sizeof(long) == 8 ? DType::kInt64 : DType::kInt32;
      return true;
    case 'q':
      out = DType::kInt64;
      return true;
    case '?':
      out = DType::kBool;
      return true;
    case 'F':
      out = DType::kComplex64;
      return true;
    case 'D':
      out = DType::kComplex128;
      return true;
    default:
      return false;
  }
}

bool native_byte_order(char order) {
  const std::uint16_t one = 1;
  const bool little = *reinterpret_cast<const unsigned char*>(&one) == 1;
  return order == '=' || order == '|' || order == (little ? '<' : '>');
}

// ---- torch -------------------------------------------------------------------------------
struct TorchTypes {
  PyObject* tensor = nullptr;         // torch.Tensor
  PyObject* dtypes[kNumDTypes] = {};  // torch.float32 ... in DType order
  PyObject* strided = nullptr;        // torch.strided
  // torch.Tensor's C accessors, called straight for objects of exactly that type (a subclass
  // may override them, so it goes through attribute lookup): ~50 ns less per tensor.
  bool direct = false;
  PyGetSetDef* get_dtype = nullptr;
  PyGetSetDef* get_is_cpu = nullptr;
  PyCFunction data_ptr = nullptr;     // METH_NOARGS
  PyCFunction numel = nullptr;        // METH_NOARGS
  PyObject* is_contiguous = nullptr;  // a method descriptor (it takes a memory_format keyword)
};

PyGetSetDef* getset_of(PyObject* type, const char* name) {
  PyObject* d = PyObject_GetAttrString(type, name);
  if (!d) return PyErr_Clear(), nullptr;
  PyGetSetDef* def = PyObject_TypeCheck(d, &PyGetSetDescr_Type)
                         ? reinterpret_cast<PyGetSetDescrObject*>(d)->d_getset
                         : nullptr;
  Py_DECREF(d);  // the type keeps the descriptor alive
  return def;
}

PyObject* method_descr_of(PyObject* type, const char* name) {
  PyObject* d = PyObject_GetAttrString(type, name);
  if (!d) return PyErr_Clear(), nullptr;
  if (PyObject_TypeCheck(d, &PyMethodDescr_Type)) return d;  // kept for the process
  Py_DECREF(d);
  return nullptr;
}

PyCFunction noargs_of(PyObject* type, const char* name) {
  PyObject* d = method_descr_of(type, name);
  if (!d) return nullptr;
  PyMethodDef* def = reinterpret_cast<PyMethodDescrObject*>(d)->d_method;
  return (def->ml_flags & METH_NOARGS) ? def->ml_meth : nullptr;
}

const TorchTypes* torch_types() {
  static TorchTypes t;
  static bool ready = false;
  if (ready) return &t;
  PyObject* tensor = imported_attr("torch", "Tensor");
  if (!tensor) return nullptr;  // torch not imported (yet): nothing here can be a tensor
  constexpr const char* kNames[kNumDTypes] = {"float32", "float64",   "float16",   "bfloat16",
                                              "int8",    "uint8",     "int32",     "int64",
                                              "bool",    "complex32", "complex64", "complex128"};
  for (int i = 0; i < kNumDTypes; ++i) t.dtypes[i] = imported_attr("torch", kNames[i]);
  t.strided = imported_attr("torch", "strided");
  t.get_dtype = getset_of(tensor, "dtype");
  t.get_is_cpu = getset_of(tensor, "is_cpu");
  t.data_ptr = noargs_of(tensor, "data_ptr");
  t.numel = noargs_of(tensor, "numel");
  t.is_contiguous = method_descr_of(tensor, "is_contiguous");
  t.direct = t.get_dtype && t.get_is_cpu && t.data_ptr && t.numel && t.is_contiguous;
  t.tensor = tensor;
  ready = true;
  return &t;
}

py::object get_attr(PyObject* obj, PyObject* name) {
  PyObject* r = PyObject_GetAttr(obj, name);
  if (!r) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

PyObject* interned(const char* s) {
  PyObject* u = PyUnicode_InternFromString(s);
  if (!u) throw py::error_already_set();
  return u;  // kept for the process
}

struct TorchNames {
  PyObject* dtype = interned("dtype");
  PyObject* is_cpu = interned("is_cpu");
  PyObject* is_contiguous = interned("is_contiguous");
  PyObject* data_ptr = interned("data_ptr");
  PyObject* numel = interned("numel");
  PyObject* layout = interned("layout");
  PyObject* device = interned("device");
  PyObject* shape = interned("shape");
};
const TorchNames& torch_names() {
  static const TorchNames names;
  return names;
}

}  // namespace

// Fills a Buffer from each source; a friend of Buffer.
struct BufferAccess {
  static void numpy(Buffer& b, PyObject* obj, const char* name) {
    auto* a = reinterpret_cast<NumpyArray*>(obj);
    auto* d = reinterpret_cast<NumpyDescr*>(a->descr);
    DType dtype;
    if (!native_byte_order(d->byteorder) || !parse_numpy_type(d->type, dtype))
      fail_dtype(name, str_of(py::handle(a->descr)));
    if (!(a->flags & kNumpyCContiguous))
      fail(name, "array is not C-contiguous; pass np.ascontiguousarray(x)");
    std::size_t count = 1;
    for (int i = 0; i < a->nd; ++i) count *= static_cast<std::size_t>(a->dimensions[i]);
    b.object_ = obj;
    b.set(a->data, count, dtype, !(a->flags & kNumpyWriteable));
    b.ndim_ = a->nd;
    b.dims_ = a->dimensions;
  }

  static void torch(Buffer& b, PyObject* obj, const TorchTypes& types, const char* name) {
    const TorchNames& n = torch_names();
    const bool direct = types.direct && Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(types.tensor);
    PyObject* args[] = {obj};
    auto checked = [](PyObject* r) {
      if (!r) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(r);
    };
    auto property = [&](PyGetSetDef* def, PyObject* attr) {
      return checked(direct ? def->get(obj, def->closure) : PyObject_GetAttr(obj, attr));
    };
    auto call = [&](PyCFunction fn, PyObject* method) {
      return checked(
          direct ? fn(obj, nullptr)
                 : PyObject_VectorcallMethod(method, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
    };
    if (property(types.get_is_cpu, n.is_cpu).ptr() != Py_True)
      fail(name, "zcoll works on CPU tensors, got a tensor on " + str_of(get_attr(obj, n.device)) +
                     "; move it with .cpu() (a CUDA path does not exist yet)");
    const py::object dtype_obj = property(types.get_dtype, n.dtype);
    int dtype = 0;
    while (dtype < kNumDTypes && types.dtypes[dtype] != dtype_obj.ptr()) ++dtype;
    if (dtype == kNumDTypes) fail_dtype(name, str_of(dtype_obj));
    PyObject* contiguous = direct ? PyObject_Vectorcall(types.is_contiguous, args, 1, nullptr)
                                  : PyObject_VectorcallMethod(n.is_contiguous, args,
                                                              1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    const bool is_contiguous = contiguous == Py_True;
    Py_XDECREF(contiguous);
    if (!is_contiguous) {  // sparse layouts answer False or raise
      std::optional<py::error_already_set> error;
      if (!contiguous) error.emplace();  // takes the Python error out of the way
      if (get_attr(obj, n.layout).ptr() != types.strided)
        fail(name, "sparse tensors are not supported (layout " + str_of(get_attr(obj, n.layout)) + ")");
      if (error) throw *error;
      fail(name, "tensor is not contiguous; call .contiguous() first");
    }
    void* data = PyLong_AsVoidPtr(call(types.data_ptr, n.data_ptr).ptr());
    const std::size_t count = PyLong_AsSize_t(call(types.numel, n.numel).ptr());
    if (PyErr_Occurred()) throw py::error_already_set();
    b.object_ = obj;
    b.torch_ = true;
    b.set(data, count, static_cast<DType>(dtype), false);
  }

  static bool dlpack(Buffer& b, PyObject* obj, const char* name) {
    PyObject* method = PyObject_GetAttrString(obj, "__dlpack__");
    if (!method) {
      PyErr_Clear();
      return false;
    }
    py::object fn = py::reinterpret_steal<py::object>(method);
    py::object capsule;
    try {
      capsule = fn(py::arg("max_version") = py::make_tuple(1, 0));
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) dlpack_failed(name, e);
      try {
        capsule = fn();  // a producer that predates max_version
      } catch (py::error_already_set& e2) {
        dlpack_failed(name, e2);
      }
    }
    PyObject* cap = capsule.ptr();
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
      auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
      PyCapsule_SetName(cap, "used_dltensor_versioned");
      b.dl_managed_ = m;  // from here on the Buffer owes the deleter call
      b.dl_versioned_ = true;
      if (m->version.major != 1)
        fail(name, detail::concat("DLPack version ", m->version.major, ".", m->version.minor,
                                  " is not supported (zcoll reads 1.x)"));
      from_dl_tensor(b, m->dl_tensor, (m->flags & kDLFlagReadOnly) != 0, name);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      PyCapsule_SetName(cap, "used_dltensor");
      b.dl_managed_ = m;
      from_dl_tensor(b, m->dl_tensor, false, name);
    } else {
      fail(name, "__dlpack__() did not return a DLPack capsule (\"dltensor\" or \"dltensor_versioned\")");
    }
    b.object_ = obj;
    return true;
  }

  [[noreturn]] static void dlpack_failed(const char* name, py::error_already_set& e) {
    fail(name, std::string("cannot read this object through DLPack (") + e.what() + ")");
  }

  static void from_dl_tensor(Buffer& b, const DLTensor& t, bool readonly, const char* name) {
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
      fail(name, detail::concat("zcoll works on CPU memory, got a DLPack tensor on device type ",
                                t.device.device_type, "; copy it to the CPU first"));
    DType dtype = DType::kFloat32;
    const DLDataType d = t.dtype;
    bool known = d.lanes == 1;
    if (d.code == kDLFloat && d.bits == 32)
      dtype = DType::kFloat32;
    else if (d.code == kDLFloat && d.bits == 64)
      dtype = DType::kFloat64;
    else if (d.code == kDLFloat && d.bits == 16)
      dtype = DType::kFloat16;
    else if (d.code == kDLBfloat && d.bits == 16)
      dtype = DType::kBFloat16;
    else if (d.code == kDLInt && d.bits == 8)
      dtype = DType::kInt8;
    else if (d.code == kDLUInt && d.bits == 8)
      dtype = DType::kUInt8;
    else if (d.code == kDLInt && d.bits == 32)
      dtype = DType::kInt32;
    else if (d.code == kDLInt && d.bits == 64)
      dtype = DType::kInt64;
    else if (d.code == kDLBool && d.bits == 8)
      dtype = DType::kBool;
    else if (d.code == kDLComplex && d.bits == 32)
      dtype = DType::kComplex32;
    else if (d.code == kDLComplex && d.bits == 64)
      dtype = DType::kComplex64;
    else if (d.code == kDLComplex && d.bits == 128)
      dtype = DType::kComplex128;
    else
      known = false;
    if (!known)
      fail_dtype(name, detail::concat("(DLPack type code ", int(d.code), ", ", int(d.bits), " bits, ",
                                      d.lanes, " lanes)"));
    std::size_t count = 1;
    for (int i = 0; i < t.ndim; ++i) count *= static_cast<std::size_t>(t.shape[i]);
    if (t.strides && count > 1) {  // null strides: compact row-major
      std::int64_t expected = 1;
      for (int i = t.ndim - 1; i >= 0; --i) {
        if (t.shape[i] != 1 && t.strides[i] != expected)
          fail(name, "array is not C-contiguous; pass np.ascontiguousarray(x)");
        expected *= t.shape[i];
      }
    }
    b.set(static_cast<char*>(t.data) + t.byte_offset, count, dtype, readonly);
    b.ndim_ = t.ndim;
    b.dl_dims_ = t.shape;
  }

  static bool buffer_protocol(Buffer& b, PyObject* obj, const char* name) {
    if (!PyObject_CheckBuffer(obj)) return false;
    if (PyObject_GetBuffer(obj, &b.view_, PyBUF_RECORDS_RO) != 0) {
      py::error_already_set e;
      fail(name, std::string("cannot read this object through the buffer protocol (") + e.what() + ")");
    }
    b.has_view_ = true;
    const Py_buffer& v = b.view_;
    DType dtype;
    if (!parse_format(v.format ? v.format : "B", v.itemsize, dtype))
      fail_dtype(name, std::string("'") + (v.format ? v.format : "B") + "' (buffer format)");
    if (!PyBuffer_IsContiguous(&v, 'C'))
      fail(name, "array is not C-contiguous; pass np.ascontiguousarray(x)");
    b.object_ = obj;
    b.set(v.buf, static_cast<std::size_t>(v.len / v.itemsize), dtype, v.readonly != 0);
    b.ndim_ = v.ndim;
    b.dims_ = v.shape;
    return true;
  }

  // struct-module format: an optional byte-order prefix, then one type character ('Z' and a
  // type character for complex, PEP 3118).
  static bool parse_format(const char* f, Py_ssize_t itemsize, DType& out) {
    const bool little = native_byte_order('<');
    if (*f == '@' || *f == '=' || (*f == '<' && little) || (*f == '>' && !little)) ++f;
    if (f[0] == 'Z' && f[1] != '\0' && f[2] == '\0') {
      out = f[1] == 'e' ? DType::kComplex32 : f[1] == 'f' ? DType::kComplex64 : DType::kComplex128;
      return (f[1] == 'e' || f[1] == 'f' || f[1] == 'd') &&
             static_cast<std::size_t>(itemsize) == dtype_size(out);
    }
    if (f[0] == '\0' || f[1] != '\0') return false;
    switch (f[0]) {
      case 'f':
        out = DType::kFloat32;
        return itemsize == 4;
      case 'd':
        out = DType::kFloat64;
        return itemsize == 8;
      case 'e':
        out = DType::kFloat16;
        return itemsize == 2;
      case 'b':
        out = DType::kInt8;
        return itemsize == 1;
      case 'B':
        out = DType::kUInt8;
        return itemsize == 1;
      case '?':
        out = DType::kBool;
        return itemsize == 1;
      case 'i':
      case 'l':
      case 'q':
      case 'n':
        if (itemsize == 4)
          out = DType::kInt32;
        else if (itemsize == 8)
          out = DType::kInt64;
        else
          return false;
        return true;
      default:
        return false;
    }
  }
};

// ---- Buffer ------------------------------------------------------------------------------
Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this == &o) return *this;
  release();
  std::memcpy(static_cast<void*>(this), static_cast<const void*>(&o), sizeof(Buffer));
  // A 1-d Py_buffer's shape may point at its own `len` (PyBuffer_FillInfo): follow the move.
  if (has_view_ && view_.shape == &o.view_.len) view_.shape = &view_.len;
  if (has_view_ && dims_ == &o.view_.len) dims_ = &view_.len;
  o.has_view_ = false;
  o.dl_managed_ = nullptr;
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::set(void* data, std::size_t count, DType dtype, bool readonly) {
  data_ = data;
  count_ = count;
  dtype_ = dtype;
  nbytes_ = count * dtype_size(dtype);
  readonly_ = readonly;
}

void Buffer::release() noexcept {
  if (has_view_) PyBuffer_Release(&view_);
  has_view_ = false;
  if (dl_managed_) {
    if (dl_versioned_) {
      auto* m = static_cast<DLManagedTensorVersioned*>(dl_managed_);
      if (m->deleter) m->deleter(m);
    } else {
      auto* m = static_cast<DLManagedTensor*>(dl_managed_);
      if (m->deleter) m->deleter(m);
    }
  }
  dl_managed_ = nullptr;
}

std::vector<long long> Buffer::shape() const {
  std::vector<long long> s;
  if (torch_) {
    for (py::handle d : get_attr(object_, torch_names().shape)) s.push_back(d.cast<long long>());
    return s;
  }
  for (int i = 0; i < ndim_; ++i) s.push_back(dims_ ? static_cast<long long>(dims_[i]) : dl_dims_[i]);
  return s;
}

Buffer acquire(py::handle handle, const char* name, Access access) {
  PyObject* obj = handle.ptr();
  Buffer b;
  PyTypeObject* ndarray = numpy_ndarray();
  const TorchTypes* torch = nullptr;
  if (ndarray && PyObject_TypeCheck(obj, ndarray)) {
    BufferAccess::numpy(b, obj, name);
  } else if ((torch = torch_types()) &&
             PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(torch->tensor))) {
    BufferAccess::torch(b, obj, *torch, name);
  } else if (!BufferAccess::dlpack(b, obj, name) && !BufferAccess::buffer_protocol(b, obj, name)) {
    throw py::type_error(detail::concat(
        name,
        ": expected a numpy array, a CPU torch.Tensor, or an object with DLPack or the buffer protocol; got ",
        Py_TYPE(obj)->tp_name));
  }
  if (access == Access::kWrite && b.readonly())
    fail(name, "buffer is read-only; pass a writable array (e.g. x.copy())");
  return b;
}

void require_like(const Buffer& out, const Buffer& x, std::size_t count, const char* name) {
  if (out.dtype() != x.dtype())
    fail(name, detail::concat("dtype ", dtype_name(out.dtype()), " does not match the input's ",
                              dtype_name(x.dtype())));
  if (out.count() != count) fail(name, detail::concat("has ", out.count(), " elements, expected ", count));
}

void require_disjoint_or_in_place(const Buffer& in, const Buffer& out, std::ptrdiff_t in_place_offset,
                                  const char* in_place_form) {
  const auto a = reinterpret_cast<std::uintptr_t>(in.data()),
             b = reinterpret_cast<std::uintptr_t>(out.data());
  const bool disjoint =
      in.nbytes() == 0 || out.nbytes() == 0 || a + in.nbytes() <= b || b + out.nbytes() <= a;
  if (disjoint || static_cast<std::ptrdiff_t>(a - b) == in_place_offset) return;
  const std::ptrdiff_t d = static_cast<std::ptrdiff_t>(a - b);
  throw std::invalid_argument(detail::concat(
      "x and out share memory but are not in the in-place position (x starts ", d < 0 ? -d : d, " bytes ",
      d < 0 ? "before" : "after", " out; x holds ", in.nbytes(), " bytes, out ", out.nbytes(),
      "): for in place pass ", in_place_form, "; otherwise pass an out that shares no memory with x"));
}

InOut take_in(py::handle x, py::handle out) {
  InOut b;
  b.same = x.ptr() == out.ptr();
  b.in = acquire(x, "x", b.same ? Access::kWrite : Access::kRead);
  return b;
}

void take_out(InOut& b, py::handle out, std::size_t count, std::ptrdiff_t in_place_offset,
              const char* in_place_form) {
  if (!b.same) b.out = acquire(out, "out", Access::kWrite);
  require_like(b.result(), b.in, count, "out");
  if (!b.same) require_disjoint_or_in_place(b.in, b.out, in_place_offset, in_place_form);
}

}  // namespace zcoll::bindings
