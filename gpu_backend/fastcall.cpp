// Replayed launches of the public GDN functions (gpu_backend/fastcall.py says when and why).
//
// A recipe is what one validated Python call did, kept with the TreePlan it ran on: the signature of
// every argument it was given (tensors: type, sizes, strides, dtype, device, 16-byte alignment;
// anything else: type and value), the outputs and scratch buffers it allocated (sizes, dtype), and
// its kernel launches (Triton's compiled function, grid, block, shared memory and the parameter
// list: an argument's data pointer, an allocation's pointer, or fixed bytes). call() matches the
// arguments of a new call against a plan's recipes; on a match it allocates, launches with
// cuLaunchKernel on the current stream and returns the outputs, else returns None and the Python
// path runs (validating, and recording a recipe). Nothing here validates beyond that match.
//
// Reference: the Python path (gpu_backend/__init__.py) launches the same kernels with the same
// arguments through Triton's launcher; properties/test_fastcall_gpu.py holds them bit-identical.
#include <Python.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

typedef int (*cu_launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                           void**, void**);
typedef int (*cu_error_t)(int, const char**);
cu_launch_t cu_launch = nullptr;
cu_error_t cu_error = nullptr;
uint64_t n_calls = 0;  // calls served here (the tests read it)

struct TensorSig {
  PyTypeObject* type;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
  c10::Device device{c10::kCPU};
  bool aligned16;
};

// One argument position: a tensor's signature, or an object compared by type and value.
struct Position {
  bool tensor;
  TensorSig sig;
  PyObject* value;   // owned (non-tensor positions)
  int same_as = -1;  // a tensor that was also an earlier argument when recorded: that argument again
};

struct Alloc {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
  bool poisonable;  // NaN-filled when poisoning is on, as the Python path's C.alloc
};

enum ParamKind { ARG = 0, ALLOC = 1, FIXED = 2 };

struct Launch {
  void* function;
  unsigned grid[3], block, shared;
  std::vector<int> kind, index;  // per parameter
  std::vector<uint64_t> slot;    // per parameter: 8 bytes the kernel reads its value from
  std::vector<void*> ptrs;       // per parameter: &slot[j], what cuLaunchKernel takes
};

struct Recipe {
  std::vector<Position> positions;
  std::vector<Alloc> allocs;
  std::vector<Launch> launches;
  std::vector<std::pair<int, int>> result;  // (ARG or ALLOC, index)
  bool as_tuple;
  c10::Device device{c10::kCPU};
  PyObject* keep;  // owned: whatever the fixed pointers point into
};

PyObject* poison_flag = nullptr;  // checks._POISON: a one-element list

TensorSig sig_of(PyObject* obj) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  return TensorSig{Py_TYPE(obj), t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.device(),
                   (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0};
}

bool same_sig(const TensorSig& s, PyObject* obj) {
  if (Py_TYPE(obj) != s.type) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  return t.scalar_type() == s.dtype && t.device() == s.device && t.sizes().equals(s.sizes) &&
         t.strides().equals(s.strides) && ((reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0) == s.aligned16;
}

bool same_value(PyObject* want, PyObject* got) {
  if (want == got) return true;
  if (Py_TYPE(want) != Py_TYPE(got)) return false;
  int eq = PyObject_RichCompareBool(want, got, Py_EQ);
  if (eq < 0) {
    PyErr_Clear();
    return false;
  }
  return eq == 1;
}

bool matches(const Recipe& r, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != static_cast<Py_ssize_t>(r.positions.size())) return false;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    const Position& p = r.positions[i];
    if (p.same_as >= 0) {  // the kernels read this tensor through the earlier argument's pointer
      if (args[i] != args[p.same_as]) return false;
    } else if (p.tensor ? !same_sig(p.sig, args[i]) : !same_value(p.value, args[i])) {
      return false;
    }
  }
  return true;
}

void destroy(PyObject* capsule) {
  auto* r = static_cast<Recipe*>(PyCapsule_GetPointer(capsule, "ddsim.fastcall.recipe"));
  if (r == nullptr) return;
  for (auto& p : r->positions) Py_XDECREF(p.value);
  Py_XDECREF(r->keep);
  delete r;
}

bool load_driver() {
  if (cu_launch != nullptr) return true;
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (lib == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "fastcall: libcuda.so.1 not found");
    return false;
  }
  cu_launch = reinterpret_cast<cu_launch_t>(dlsym(lib, "cuLaunchKernel"));
  cu_error = reinterpret_cast<cu_error_t>(dlsym(lib, "cuGetErrorString"));
  if (cu_launch == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "fastcall: cuLaunchKernel not found in libcuda.so.1");
    return false;
  }
  return true;
}

int as_int(PyObject* seq, Py_ssize_t i) {
  return static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(seq, i)));
}

// make(positions, allocs, launches, result, as_tuple, device, keep) -> a recipe (a capsule).
//   positions: tuple of (True, tensor), (True, tensor, j) for a tensor that was also argument j < its
//   position (a replay then requires the same object there), or (False, value); allocs: tuple of
//   (tensor, poisonable);
//   launches: tuple of (function, gx, gy, gz, block, shared, params) with params a tuple of
//   (ARG, position) / (ALLOC, index) / (FIXED, 8 bytes); result: tuple of (ARG or ALLOC, index).
PyObject* make(PyObject*, PyObject* args) {
  PyObject *positions, *allocs, *launches, *result, *keep;
  int as_tuple, device;
  if (!PyArg_ParseTuple(args, "O!O!O!O!piO", &PyTuple_Type, &positions, &PyTuple_Type, &allocs, &PyTuple_Type,
                        &launches, &PyTuple_Type, &result, &as_tuple, &device, &keep))
    return nullptr;
  auto* r = new Recipe();
  r->as_tuple = as_tuple;
  r->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
  Py_INCREF(keep);
  r->keep = keep;
  PyObject* capsule = PyCapsule_New(r, "ddsim.fastcall.recipe", destroy);
  if (capsule == nullptr) {
    Py_DECREF(keep);
    delete r;
    return nullptr;
  }
  try {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(positions); ++i) {
      PyObject* p = PyTuple_GET_ITEM(positions, i);
      PyObject* obj = PyTuple_GET_ITEM(p, 1);
      if (PyObject_IsTrue(PyTuple_GET_ITEM(p, 0))) {
        if (!THPVariable_Check(obj)) throw std::runtime_error("a tensor position holds no tensor");
        r->positions.push_back(Position{true, sig_of(obj), nullptr});
        if (PyTuple_GET_SIZE(p) > 2) {
          int j = as_int(p, 2);
          if (j < 0 || j >= i || !r->positions[j].tensor) throw std::runtime_error("a tensor aliases no earlier tensor");
          r->positions.back().same_as = j;
        }
      } else {
        Py_INCREF(obj);
        r->positions.push_back(Position{false, TensorSig{}, obj});
      }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(allocs); ++i) {
      PyObject* a = PyTuple_GET_ITEM(allocs, i);
      const at::Tensor& t = THPVariable_Unpack(PyTuple_GET_ITEM(a, 0));
      if (!t.is_contiguous()) throw std::runtime_error("an allocation is not contiguous");
      r->allocs.push_back(Alloc{t.sizes().vec(), t.scalar_type(), PyObject_IsTrue(PyTuple_GET_ITEM(a, 1)) == 1});
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(launches); ++i) {
      PyObject* l = PyTuple_GET_ITEM(launches, i);
      Launch L;
      L.function = PyLong_AsVoidPtr(PyTuple_GET_ITEM(l, 0));
      for (int d = 0; d < 3; ++d) L.grid[d] = static_cast<unsigned>(as_int(l, 1 + d));
      L.block = static_cast<unsigned>(as_int(l, 4));
      L.shared = static_cast<unsigned>(as_int(l, 5));
      PyObject* params = PyTuple_GET_ITEM(l, 6);
      for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(params); ++j) {
        PyObject* p = PyTuple_GET_ITEM(params, j);
        int kind = as_int(p, 0);
        uint64_t bytes = 0;
        int index = -1;
        if (kind == FIXED) {
          char* buf;
          Py_ssize_t n;
          if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(p, 1), &buf, &n) < 0 || n != 8)
            throw std::runtime_error("a fixed parameter is not 8 bytes");
          std::memcpy(&bytes, buf, 8);
        } else {
          index = as_int(p, 1);
          Py_ssize_t bound = kind == ARG ? static_cast<Py_ssize_t>(r->positions.size())
                                         : static_cast<Py_ssize_t>(r->allocs.size());
          if ((kind != ARG && kind != ALLOC) || index < 0 || index >= bound)
            throw std::runtime_error("a parameter names no argument or allocation");
          if (kind == ARG && !r->positions[index].tensor)
            throw std::runtime_error("a pointer parameter names a non-tensor argument");
        }
        L.kind.push_back(kind);
        L.index.push_back(index);
        L.slot.push_back(bytes);
      }
      r->launches.push_back(std::move(L));
    }
    for (Launch& L : r->launches)
      for (uint64_t& s : L.slot) L.ptrs.push_back(&s);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(result); ++i) {
      PyObject* p = PyTuple_GET_ITEM(result, i);
      r->result.emplace_back(as_int(p, 0), as_int(p, 1));
    }
    if (PyErr_Occurred()) throw std::runtime_error("a malformed recipe");
  } catch (const std::exception& e) {
    Py_DECREF(capsule);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  return capsule;
}

// The parameters of launch L for these arguments and allocations (pointers filled in its slots).
// out: the allocations' addresses, in the recipe's order.
void fill(Launch& L, PyObject* const* args, const std::vector<uint64_t>& out) {
  for (size_t j = 0; j < L.kind.size(); ++j) {
    if (L.kind[j] == ARG)
      L.slot[j] = reinterpret_cast<uint64_t>(THPVariable_Unpack(args[L.index[j]]).data_ptr());
    else if (L.kind[j] == ALLOC)
      L.slot[j] = out[L.index[j]];
  }
}

PyObject* wrap_result(const Recipe& r, PyObject* const* args, const std::vector<at::Tensor>& out) {
  auto one = [&](const std::pair<int, int>& p) -> PyObject* {
    if (p.first == ARG) {
      Py_INCREF(args[p.second]);
      return args[p.second];
    }
    return THPVariable_Wrap(out[p.second]);
  };
  if (!r.as_tuple) return one(r.result[0]);
  PyObject* tup = PyTuple_New(static_cast<Py_ssize_t>(r.result.size()));
  if (tup == nullptr) return nullptr;
  for (size_t i = 0; i < r.result.size(); ++i) {
    PyObject* x = one(r.result[i]);
    if (x == nullptr) {
      Py_DECREF(tup);
      return nullptr;
    }
    PyTuple_SET_ITEM(tup, static_cast<Py_ssize_t>(i), x);
  }
  return tup;
}

// call(recipes, *args): the outputs of the first recipe matching args, launched; None if none matches.
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyList_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "fastcall.call(recipes: list, *args)");
    return nullptr;
  }
  PyObject* recipes = args[0];
  Recipe* r = nullptr;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(recipes) && r == nullptr; ++i) {
    auto* c = static_cast<Recipe*>(PyCapsule_GetPointer(PyList_GET_ITEM(recipes, i), "ddsim.fastcall.recipe"));
    if (c == nullptr) return nullptr;
    if (matches(*c, args + 1, nargs - 1)) r = c;
  }
  if (r == nullptr) Py_RETURN_NONE;
  try {
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::kCUDA);
    if (impl->getDevice() != r->device) Py_RETURN_NONE;  // launches run on the current device
    if (!load_driver()) return nullptr;
    void* stream = impl->getStream(r->device).native_handle();
    bool poison = poison_flag != nullptr && PyObject_IsTrue(PyList_GET_ITEM(poison_flag, 0)) == 1;
    std::vector<at::Tensor> out;
    std::vector<uint64_t> addresses;
    out.reserve(r->allocs.size());
    for (const Alloc& a : r->allocs) {
      out.push_back(at::empty(a.sizes, at::TensorOptions().dtype(a.dtype).device(r->device)));
      if (poison && a.poisonable) out.back().fill_(NAN);
      addresses.push_back(reinterpret_cast<uint64_t>(out.back().data_ptr()));
    }
    PyObject* const* in = args + 1;
    for (Launch& L : r->launches) {
      fill(L, in, addresses);
      int err = cu_launch(L.function, L.grid[0], L.grid[1], L.grid[2], L.block, 1, 1, L.shared, stream,
                          L.ptrs.data(), nullptr);
      if (err != 0) {
        const char* msg = "unknown";
        if (cu_error != nullptr) cu_error(err, &msg);
        PyErr_Format(PyExc_RuntimeError, "fastcall: cuLaunchKernel failed: %s", msg);
        return nullptr;
      }
    }
    ++n_calls;
    return wrap_result(*r, in, out);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// match(recipe, *args) -> bool (tests: the signature check alone, on any device).
PyObject* match(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "fastcall.match(recipe, *args)");
    return nullptr;
  }
  auto* r = static_cast<Recipe*>(PyCapsule_GetPointer(args[0], "ddsim.fastcall.recipe"));
  if (r == nullptr) return nullptr;
  return PyBool_FromLong(matches(*r, args + 1, nargs - 1));
}

// params(recipe, launch, *args) -> tuple of the 8-byte parameter slots launch would pass for args
// (tests; allocations read as 0).
PyObject* params(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "fastcall.params(recipe, launch, *args)");
    return nullptr;
  }
  auto* r = static_cast<Recipe*>(PyCapsule_GetPointer(args[0], "ddsim.fastcall.recipe"));
  if (r == nullptr) return nullptr;
  long i = PyLong_AsLong(args[1]);
  if (i < 0 || i >= static_cast<long>(r->launches.size()) || nargs - 2 != static_cast<Py_ssize_t>(r->positions.size())) {
    PyErr_SetString(PyExc_IndexError, "fastcall.params: no such launch, or the wrong number of arguments");
    return nullptr;
  }
  Launch L = r->launches[i];
  fill(L, args + 2, std::vector<uint64_t>(r->allocs.size(), 0));  // what call() passes, allocations at 0
  PyObject* tup = PyTuple_New(static_cast<Py_ssize_t>(L.slot.size()));
  for (size_t j = 0; j < L.slot.size(); ++j)
    PyTuple_SET_ITEM(tup, static_cast<Py_ssize_t>(j), PyLong_FromUnsignedLongLong(L.slot[j]));
  return tup;
}

PyObject* set_poison_flag(PyObject*, PyObject* flag) {
  if (!PyList_Check(flag) || PyList_GET_SIZE(flag) != 1) {
    PyErr_SetString(PyExc_TypeError, "fastcall.set_poison_flag: a one-element list");
    return nullptr;
  }
  Py_INCREF(flag);
  Py_XDECREF(poison_flag);
  poison_flag = flag;
  Py_RETURN_NONE;
}

PyObject* calls(PyObject*, PyObject*) { return PyLong_FromUnsignedLongLong(n_calls); }

PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "make(positions, allocs, launches, result, as_tuple, device, keep) -> recipe"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call)), METH_FASTCALL,
     "call(recipes, *args) -> outputs, or None when no recipe matches"},
    {"match", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(match)), METH_FASTCALL,
     "match(recipe, *args) -> bool"},
    {"params", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(params)), METH_FASTCALL,
     "params(recipe, launch, *args) -> the parameter slots"},
    {"set_poison_flag", set_poison_flag, METH_O, "the Python path's poisoning flag (a one-element list)"},
    {"calls", calls, METH_NOARGS, "calls served so far"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "ddsim_fastcall", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_ddsim_fastcall(void) { return PyModule_Create(&module); }
