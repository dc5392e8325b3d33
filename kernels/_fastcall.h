// Python entry points that call a kprof operator without torch.ops' per-call argument parsing.
//
// `torch.ops.kprof.<op>.default(...)` converts every argument through the operator's schema into a stack of IValues
// and calls the operator boxed: on a step of a host-bound model that costs microseconds a call more than torch's own
// generated bindings. The entry made here reads plain arguments straight into the C++ types of the operator's
// signature and calls it through its typed dispatcher handle, with the GIL released, as torch's bindings do; the
// dispatcher, and so autograd, autocast, the profiler and every dispatch key, sees exactly the call torch.ops makes.
// Anything else (a Tensor subclass, a __torch_function__ mode, a fake or traced value, a keyword, a wrong count)
// goes to the OpOverload the entry was made with, which gives the same result or the same error as before.
#pragma once

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Metaprogramming.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <Python.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

namespace kprof::fastcall {

// Arg<T>::read(obj) takes one Python argument as the C++ parameter type T (false: not a plain value of that kind, so
// the call takes the OpOverload); get() hands it to the operator.
template <typename T>
struct Arg;

template <>
struct Arg<const at::Tensor&> {
  const at::Tensor* value = nullptr;
  bool read(PyObject* obj) {
    if (!THPVariable_CheckExact(obj)) return false;  // a plain Tensor or Parameter: no __torch_function__ to honour
    value = &THPVariable_Unpack(obj);
    return true;
  }
  const at::Tensor& get() const { return *value; }
};

template <>
struct Arg<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> value;
  bool read(PyObject* obj) {
    if (obj == Py_None) return true;
    if (!THPVariable_CheckExact(obj)) return false;
    value = THPVariable_Unpack(obj);
    return true;
  }
  const std::optional<at::Tensor>& get() const { return value; }
};

template <>
struct Arg<double> {
  double value = 0.0;
  bool read(PyObject* obj) {
    if (PyFloat_CheckExact(obj)) {
      value = PyFloat_AS_DOUBLE(obj);
      return true;
    }
    return false;
  }
  double get() const { return value; }
};

template <>
struct Arg<int64_t> {
  int64_t value = 0;
  bool read(PyObject* obj) {
    if (!PyLong_CheckExact(obj)) return false;  // bool is a subclass of int: the OpOverload decides about it
    int overflow = 0;
    value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    return true;
  }
  int64_t get() const { return value; }
};

template <>
struct Arg<std::optional<double>> {
  std::optional<double> value;
  bool read(PyObject* obj) {
    if (obj == Py_None) return true;
    Arg<double> number;
    if (!number.read(obj)) return false;
    value = number.get();
    return true;
  }
  std::optional<double> get() const { return value; }
};

template <>
struct Arg<c10::string_view> {
  c10::string_view value;
  bool read(PyObject* obj) {
    if (!PyUnicode_CheckExact(obj)) return false;
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(obj, &size);
    if (data == nullptr) {
      PyErr_Clear();  // not encodable: the OpOverload raises its own error
      return false;
    }
    value = c10::string_view(data, static_cast<size_t>(size));
    return true;
  }
  c10::string_view get() const { return value; }
};

// A tuple or list of up to kMaxDims plain ints (a normalized_shape).
template <>
struct Arg<c10::SymIntArrayRef> {
  static constexpr Py_ssize_t kMaxDims = 8;
  std::array<c10::SymInt, kMaxDims> dims;
  size_t size = 0;
  bool read(PyObject* obj) {
    const bool tuple = PyTuple_CheckExact(obj);
    if (!tuple && !PyList_CheckExact(obj)) return false;
    const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
    if (n > kMaxDims) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = tuple ? PyTuple_GET_ITEM(obj, i) : PyList_GET_ITEM(obj, i);
      if (!PyLong_CheckExact(item)) return false;
      const long long dim = PyLong_AsLongLong(item);
      if (dim == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      dims[static_cast<size_t>(i)] = c10::SymInt(static_cast<int64_t>(dim));
    }
    size = static_cast<size_t>(n);
    return true;
  }
  c10::SymIntArrayRef get() const { return c10::SymIntArrayRef(dims.data(), size); }
};

// Releases the GIL for its lifetime (as torch's generated bindings do around a dispatch).
class WithoutGil {
 public:
  WithoutGil() : state_(PyEval_SaveThread()) {}
  ~WithoutGil() { PyEval_RestoreThread(state_); }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* state_;
};

// The entry of the operator whose (autograd) kernel is `kernel`: Sig is the operator's C++ signature.
template <auto& kernel>
struct Entry {
  using Sig = std::remove_reference_t<decltype(kernel)>;
  using Params = typename c10::guts::infer_function_traits_t<Sig>::parameter_types;
  static inline std::optional<c10::TypedOperatorHandle<Sig>> handle;

  template <typename... P>
  static std::tuple<Arg<P>...> args_of(c10::guts::typelist::typelist<P...>*);
  using Args = decltype(args_of(static_cast<Params*>(nullptr)));
  static constexpr size_t kArity = std::tuple_size_v<Args>;

  template <size_t... I>
  static bool read(Args& args, PyObject* const* objs, std::index_sequence<I...>) {
    return (std::get<I>(args).read(objs[I]) && ...);
  }

  template <size_t... I>
  static at::Tensor run(const Args& args, std::index_sequence<I...>) {
    return handle->call(std::get<I>(args).get()...);
  }

  // `fallback` (the OpOverload) is the function's self.
  static PyObject* call(PyObject* fallback, PyObject* const* objs, Py_ssize_t n, PyObject* keywords) {
    HANDLE_TH_ERRORS
    Args args;
    if (keywords == nullptr && n == static_cast<Py_ssize_t>(kArity) && !at::impl::torch_function_mode_enabled() &&
        read(args, objs, std::make_index_sequence<kArity>{})) {
      at::Tensor out;
      {
        const WithoutGil released;  // an error thrown by the operator takes the GIL back on its way out
        out = run(args, std::make_index_sequence<kArity>{});
      }
      return THPVariable_Wrap(std::move(out));
    }
    return PyObject_Vectorcall(fallback, objs, static_cast<size_t>(n), keywords);
    END_HANDLE_TH_ERRORS
  }

  static inline PyMethodDef def{"fastcall", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call)),
                                METH_FASTCALL | METH_KEYWORDS,
                                "a kprof operator called through its typed dispatcher handle"};

  static PyObject* make(const char* op, PyObject* fallback) {
    handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, "").template typed<Sig>();
    return PyCFunction_New(&def, fallback);
  }
};

struct Maker {
  const char* op;  // "kprof::<name>"
  PyObject* (*make)(const char* op, PyObject* fallback);
};

// The module function `fast(op, overload)`: the entry of `op` ("kprof::<name>") falling back to `overload`, or None
// where this library has none. `makers` ends with {nullptr, nullptr}.
template <const Maker* makers>
PyObject* fast(PyObject*, PyObject* const* objs, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 2 || !PyUnicode_Check(objs[0])) {
    PyErr_SetString(PyExc_TypeError, "fast(op: str, overload) takes two arguments");
    return nullptr;
  }
  const char* op = PyUnicode_AsUTF8(objs[0]);
  if (op == nullptr) return nullptr;
  for (const Maker* m = makers; m->op != nullptr; ++m) {
    if (std::string_view(m->op) == op) return m->make(m->op, objs[1]);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

}  // namespace kprof::fastcall

// One entry of KPROF_PYTHON_MODULE: the operator kprof::<name> whose autograd kernel is `kernel`.
#define KPROF_FAST(name, kernel) \
  ::kprof::fastcall::Maker { "kprof::" name, &::kprof::fastcall::Entry<kernel>::make }
