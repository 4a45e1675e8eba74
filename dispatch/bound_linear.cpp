// The bound layer of dispatch.bind in C++ (dispatch/native.py builds and loads it).
//
// Why C++: a Python bound layer costs about 1 us per call over F.linear's host time (docs/design.md). Here the
// per-call work is a type test, the activation's M, a lookup of the choice per M (asked of Python once per M: the
// same ShapeRule.choice the Python layer runs), a thread-local capture depth and at::linear, without the Python
// argument parser F.linear goes through. Where the choice is a FlashInfer kernel the activation's checks and the
// output are done here too, and the kernel's Python `into(x, w, out)` is called (TVM-FFI functions).
//
// Everything this layer does not decide itself goes to `fallback`, the Python bound layer with the same semantics:
// keyword arguments, a tensor subclass or a torch function mode (which F.linear honours and at::linear would not).
//
// `Linear` is dispatch.linear(x, weight, bias) in C++, the drop-in without binding: per call it looks up the weight
// shape's rule (asked of Python once per (device, N, K)) and the M (once per M), and where both regimes run F.linear
// calls at::linear; every other call (a kernel in either regime, or anything it does not decide) goes to the Python
// dispatch.linear, which makes the same choices.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

thread_local int64_t capture_depth = 0;  // CUDA graph captures open in this thread (kept by dispatch/capture.py)
constexpr size_t kChoicesKept = 4096;  // M values remembered per layer; at the cap the memory starts over

struct Kernel {
  PyObject* entry;  // the (into, alignment) tuple it came from, owned; identity is the slot's key
  PyObject* into;   // borrowed from entry
  int64_t align;
};

struct State {
  at::Tensor weight;
  c10::optional<at::Tensor> bias;
  int64_t n = 0, k = 0, device = -1;
  std::vector<Kernel> kernels;                    // slot i + 1
  std::unordered_map<int64_t, uint32_t> choices;  // M -> graph slot << 16 | eager slot (0: F.linear)
  bool release_gil = true;
};

struct BoundLinear {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* weight_obj;  // owned: passed to the kernels' into
  PyObject* decide;      // owned: M -> (graph, eager entry), each None for F.linear
  PyObject* fallback;    // owned: the Python bound layer
  State* state;
};

// Released for the launch as F.linear does (another thread may hold a lock the launch needs and wait for the GIL);
// restored on the way out, exceptions included.
struct GilReleased {
  PyThreadState* saved;
  explicit GilReleased(bool release) : saved(release ? PyEval_SaveThread() : nullptr) {}
  ~GilReleased() {
    if (saved) PyEval_RestoreThread(saved);
  }
};

// The slot of a kernel entry (0: None, F.linear), added on first sight; -1 with a Python error set.
int64_t slot_of(State& s, PyObject* entry) {
  if (entry == Py_None) return 0;
  for (size_t i = 0; i < s.kernels.size(); ++i)
    if (s.kernels[i].entry == entry) return static_cast<int64_t>(i + 1);
  int64_t align = -1;
  if (PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2 && PyCallable_Check(PyTuple_GET_ITEM(entry, 0)))
    align = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
  if (align <= 0 || s.kernels.size() >= 0xfffe) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "decide(m): an entry is not (into, alignment > 0)");
    return -1;
  }
  Py_INCREF(entry);
  s.kernels.push_back(Kernel{entry, PyTuple_GET_ITEM(entry, 0), align});
  return static_cast<int64_t>(s.kernels.size());
}

// The choice at M, asked of Python once per M and remembered; returns false with a Python error set.
bool choice_at(BoundLinear* self, int64_t m, uint32_t* code) {
  State& s = *self->state;
  auto it = s.choices.find(m);
  if (it != s.choices.end()) {
    *code = it->second;
    return true;
  }
  PyObject* pm = PyLong_FromLongLong(m);
  if (!pm) return false;
  PyObject* r = PyObject_CallOneArg(self->decide, pm);
  Py_DECREF(pm);
  if (!r) return false;
  if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
    Py_DECREF(r);
    PyErr_SetString(PyExc_TypeError, "decide(m) must return (graph, eager entry), each None for F.linear");
    return false;
  }
  const int64_t g = slot_of(s, PyTuple_GET_ITEM(r, 0));
  const int64_t e = g < 0 ? -1 : slot_of(s, PyTuple_GET_ITEM(r, 1));
  Py_DECREF(r);
  if (e < 0) return false;
  if (s.choices.size() >= kChoicesKept) s.choices.clear();
  *code = s.choices[m] = static_cast<uint32_t>(g) << 16 | static_cast<uint32_t>(e);
  return true;
}

// F.linear's kernel, as a new Python tensor; the GIL released for the launch where asked.
PyObject* linear_released(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                          bool release_gil) {
  at::Tensor y;
  {
    GilReleased released(release_gil);
    y = at::linear(x, w, bias);
  }
  return THPVariable_Wrap(std::move(y));
}

PyObject* f_linear(State& s, const at::Tensor& x) { return linear_released(x, s.weight, s.bias, s.release_gil); }

PyObject* call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<BoundLinear*>(callable);
  if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != nullptr || Py_TYPE(args[0]) != (PyTypeObject*)THPVariableClass ||
      at::impl::torch_function_mode_enabled())
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
  HANDLE_TH_ERRORS
  State& s = *self->state;
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const int64_t dim = x.dim();
  const int64_t numel = x.numel();
  if (dim == 0 || numel == 0 || x.size(-1) != s.k) return f_linear(s, x);  // F.linear's answer, an error maybe
  const int64_t m = numel / s.k;
  uint32_t code;
  if (!choice_at(self, m, &code)) return nullptr;
  const uint32_t graph = code >> 16, eager = code & 0xffff;
  const uint32_t use = graph == eager || capture_depth > 0 ? graph : eager;
  if (use == 0) return f_linear(s, x);
  const Kernel& kern = s.kernels[use - 1];
  if (x.scalar_type() != at::kBFloat16 || !x.is_contiguous() ||
      reinterpret_cast<uintptr_t>(x.data_ptr()) % static_cast<uintptr_t>(kern.align) != 0 ||
      x.get_device() != s.device)
    return f_linear(s, x);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = s.n;
  at::Tensor out = at::empty(sizes, x.options());
  PyObject* out_obj = THPVariable_Wrap(out);
  if (!out_obj) return nullptr;
  PyObject *x2 = args[0], *out2 = out_obj;
  if (dim != 2) {  // the kernels take [M, K] -> [M, N]
    x2 = THPVariable_Wrap(x.view({m, s.k}));
    out2 = x2 ? THPVariable_Wrap(out.view({m, s.n})) : nullptr;
  }
  PyObject* r = nullptr;
  if (out2) {
    PyObject* kargs[3] = {x2, self->weight_obj, out2};
    r = PyObject_Vectorcall(kern.into, kargs, 3, nullptr);
  }
  if (dim != 2) {
    Py_XDECREF(x2);
    Py_XDECREF(out2);
  }
  if (!r) {
    Py_DECREF(out_obj);
    return nullptr;
  }
  Py_DECREF(r);
  return out_obj;
  END_HANDLE_TH_ERRORS
}

PyObject* bound_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"weight", "bias", "decide", "fallback", "release_gil", nullptr};
  PyObject *weight, *bias, *decide, *fallback;
  int release_gil = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|p", const_cast<char**>(names), &weight, &bias, &decide,
                                   &fallback, &release_gil))
    return nullptr;
  if (!THPVariable_Check(weight) || (bias != Py_None && !THPVariable_Check(bias))) {
    PyErr_SetString(PyExc_TypeError, "BoundLinear(weight, bias, decide, fallback): weight and bias must be tensors");
    return nullptr;
  }
  if (!PyCallable_Check(decide) || !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "BoundLinear: decide and fallback must be callables");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  const at::Tensor& w = THPVariable_Unpack(weight);
  TORCH_CHECK(w.dim() == 2, "BoundLinear needs a 2-D weight [N, K]");
  auto* self = reinterpret_cast<BoundLinear*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->vectorcall = call;
  self->state = new State();
  self->state->weight = w;
  if (bias != Py_None) self->state->bias = THPVariable_Unpack(bias);
  self->state->n = w.size(0);
  self->state->k = w.size(1);
  self->state->device = w.get_device();
  self->state->release_gil = release_gil != 0;
  Py_INCREF(weight);
  Py_INCREF(decide);
  Py_INCREF(fallback);
  self->weight_obj = weight;
  self->decide = decide;
  self->fallback = fallback;
  return reinterpret_cast<PyObject*>(self);
  END_HANDLE_TH_ERRORS
}

void bound_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<BoundLinear*>(obj);
  PyObject_GC_UnTrack(obj);
  if (self->state) {
    for (auto& kern : self->state->kernels) Py_DECREF(kern.entry);
    delete self->state;
    self->state = nullptr;
  }
  Py_CLEAR(self->weight_obj);
  Py_CLEAR(self->decide);
  Py_CLEAR(self->fallback);
  Py_TYPE(obj)->tp_free(obj);
}

int bound_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<BoundLinear*>(obj);
  Py_VISIT(self->weight_obj);
  Py_VISIT(self->decide);
  Py_VISIT(self->fallback);
  if (self->state)
    for (auto& kern : self->state->kernels) Py_VISIT(kern.entry);
  return 0;
}

int bound_clear(PyObject* obj) {
  auto* self = reinterpret_cast<BoundLinear*>(obj);
  if (self->state) {
    for (auto& kern : self->state->kernels) Py_DECREF(kern.entry);
    self->state->kernels.clear();
    self->state->choices.clear();
  }
  Py_CLEAR(self->decide);
  Py_CLEAR(self->fallback);
  return 0;
}

PyObject* bound_remembered(PyObject* obj, PyObject*) {  // {M: (graph slot, eager slot)}, for tests
  auto* self = reinterpret_cast<BoundLinear*>(obj);
  PyObject* d = PyDict_New();
  if (!d || !self->state) return d;
  for (auto& [m, code] : self->state->choices) {
    PyObject* key = PyLong_FromLongLong(m);
    PyObject* val = Py_BuildValue("(II)", static_cast<unsigned>(code >> 16), static_cast<unsigned>(code & 0xffff));
    if (!key || !val || PyDict_SetItem(d, key, val) < 0) {
      Py_XDECREF(key);
      Py_XDECREF(val);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(key);
    Py_DECREF(val);
  }
  return d;
}

PyMethodDef bound_methods[] = {
    {"remembered", bound_remembered, METH_NOARGS,
     "the remembered choices: {M: (graph slot, eager slot)}, 0 = F.linear"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject BoundLinearType = {PyVarObject_HEAD_INIT(nullptr, 0)};


// ---- dispatch.linear ------------------------------------------------------------------------------------------

struct ShapeKey {
  int64_t device, n, k;
  bool operator==(const ShapeKey& o) const { return device == o.device && n == o.n && k == o.k; }
};

struct ShapeKeyHash {
  size_t operator()(const ShapeKey& key) const {
    const std::hash<int64_t> h;
    return h(key.n) * 1000003u ^ h(key.k) * 8191u ^ h(key.device);
  }
};

struct ShapeChoices {
  int64_t limit_m = -1;                      // above it both regimes run F.linear (-1: at every M)
  PyObject* f_linear_at = nullptr;           // owned: m -> whether both regimes run F.linear at m
  std::unordered_map<int64_t, bool> at;      // its answers, remembered (at most kChoicesKept, then start over)
};

using ShapeMap = std::unordered_map<ShapeKey, ShapeChoices, ShapeKeyHash>;

struct Linear {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* rule_of;     // owned: (device, weight) -> (limit_m, f_linear_at)
  PyObject* fallback;    // owned: the Python dispatch.linear
  PyObject* param_type;  // owned: torch.nn.Parameter (a plain tensor, like torch.Tensor)
  ShapeMap* shapes;
  bool release_gil;
};

void forget_shapes(ShapeMap* shapes) {
  if (!shapes) return;
  for (auto& [key, c] : *shapes) Py_CLEAR(c.f_linear_at);
  shapes->clear();
}

// The rule of a weight shape on a device, asked of Python on first sight; nullptr with a Python error set.
ShapeChoices* shape_choices(Linear* self, int64_t device, PyObject* weight_obj, int64_t n, int64_t k) {
  const ShapeKey key{device, n, k};
  auto it = self->shapes->find(key);
  if (it != self->shapes->end()) return &it->second;
  PyObject* r = PyObject_CallFunction(self->rule_of, "LO", static_cast<long long>(device), weight_obj);
  if (!r) return nullptr;
  int64_t limit = -1;
  if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 && PyCallable_Check(PyTuple_GET_ITEM(r, 1)))
    limit = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
  else if (!PyErr_Occurred())
    PyErr_SetString(PyExc_TypeError, "rule_of(device, weight) must return (limit_m, f_linear_at)");
  if (PyErr_Occurred()) {
    Py_DECREF(r);
    return nullptr;
  }
  ShapeChoices c;
  c.limit_m = limit;
  c.f_linear_at = PyTuple_GET_ITEM(r, 1);
  Py_INCREF(c.f_linear_at);
  Py_DECREF(r);
  return &self->shapes->emplace(key, std::move(c)).first->second;
}

// Whether both regimes run F.linear at M: 1 yes, 0 no, -1 with a Python error set.
int f_linear_in_both(ShapeChoices& c, int64_t m) {
  if (m > c.limit_m) return 1;
  auto it = c.at.find(m);
  if (it != c.at.end()) return it->second ? 1 : 0;
  PyObject* pm = PyLong_FromLongLong(m);
  if (!pm) return -1;
  PyObject* r = PyObject_CallOneArg(c.f_linear_at, pm);
  Py_DECREF(pm);
  if (!r) return -1;
  const int both = PyObject_IsTrue(r);
  Py_DECREF(r);
  if (both < 0) return -1;
  if (c.at.size() >= kChoicesKept) c.at.clear();
  c.at[m] = both != 0;
  return both;
}

PyObject* linear_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<Linear*>(callable);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* bias_obj = nargs == 3 ? args[2] : Py_None;
  auto plain = [self](PyObject* o) {
    return Py_TYPE(o) == (PyTypeObject*)THPVariableClass || Py_TYPE(o) == (PyTypeObject*)self->param_type;
  };
  if ((nargs != 2 && nargs != 3) || kwnames != nullptr || !plain(args[0]) || !plain(args[1]) ||
      (bias_obj != Py_None && !plain(bias_obj)) || at::impl::torch_function_mode_enabled())
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
  HANDLE_TH_ERRORS
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& w = THPVariable_Unpack(args[1]);
  if (w.dim() != 2) return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
  const int64_t k = w.size(1), numel = x.numel(), dim = x.dim();
  bool both = true;  // F.linear's own answer where the shapes do not fit (an error maybe)
  if (dim != 0 && numel != 0 && x.size(-1) == k) {
    ShapeChoices* c = shape_choices(self, x.get_device(), args[1], w.size(0), k);
    if (!c) return nullptr;
    const int answer = f_linear_in_both(*c, numel / k);
    if (answer < 0) return nullptr;
    both = answer == 1;
  }
  if (!both) return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
  c10::optional<at::Tensor> bias;
  if (bias_obj != Py_None) bias = THPVariable_Unpack(bias_obj);
  return linear_released(x, w, bias, self->release_gil);
  END_HANDLE_TH_ERRORS
}

PyObject* linear_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"rule_of", "fallback", "parameter_type", "release_gil", nullptr};
  PyObject *rule_of, *fallback, *param_type;
  int release_gil = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|p", const_cast<char**>(names), &rule_of, &fallback,
                                   &param_type, &release_gil))
    return nullptr;
  if (!PyCallable_Check(rule_of) || !PyCallable_Check(fallback) || !PyType_Check(param_type)) {
    PyErr_SetString(PyExc_TypeError, "Linear(rule_of, fallback, parameter_type): two callables and a type");
    return nullptr;
  }
  auto* self = reinterpret_cast<Linear*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->vectorcall = linear_call;
  self->shapes = new ShapeMap();
  self->release_gil = release_gil != 0;
  Py_INCREF(rule_of);
  Py_INCREF(fallback);
  Py_INCREF(param_type);
  self->rule_of = rule_of;
  self->fallback = fallback;
  self->param_type = param_type;
  return reinterpret_cast<PyObject*>(self);
}

void linear_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<Linear*>(obj);
  PyObject_GC_UnTrack(obj);
  forget_shapes(self->shapes);
  delete self->shapes;
  self->shapes = nullptr;
  Py_CLEAR(self->rule_of);
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->param_type);
  Py_TYPE(obj)->tp_free(obj);
}

int linear_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<Linear*>(obj);
  Py_VISIT(self->rule_of);
  Py_VISIT(self->fallback);
  Py_VISIT(self->param_type);
  if (self->shapes)
    for (auto& [key, c] : *self->shapes) Py_VISIT(c.f_linear_at);
  return 0;
}

int linear_clear(PyObject* obj) {
  auto* self = reinterpret_cast<Linear*>(obj);
  forget_shapes(self->shapes);
  Py_CLEAR(self->rule_of);
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->param_type);
  return 0;
}

PyObject* linear_forget(PyObject* obj, PyObject*) {
  forget_shapes(reinterpret_cast<Linear*>(obj)->shapes);
  Py_RETURN_NONE;
}

PyObject* linear_remembered(PyObject* obj, PyObject*) {  // {(device, N, K): (limit_m, {M: both F.linear})}, for tests
  auto* self = reinterpret_cast<Linear*>(obj);
  PyObject* d = PyDict_New();
  if (!d || !self->shapes) return d;
  for (auto& [key, c] : *self->shapes) {
    PyObject* at = PyDict_New();
    if (!at) {
      Py_DECREF(d);
      return nullptr;
    }
    for (auto& [m, both] : c.at) {
      PyObject* pm = PyLong_FromLongLong(m);
      if (!pm || PyDict_SetItem(at, pm, both ? Py_True : Py_False) < 0) {
        Py_XDECREF(pm);
        Py_DECREF(at);
        Py_DECREF(d);
        return nullptr;
      }
      Py_DECREF(pm);
    }
    PyObject* k = Py_BuildValue("(LLL)", static_cast<long long>(key.device), static_cast<long long>(key.n),
                                static_cast<long long>(key.k));
    PyObject* v = Py_BuildValue("(LN)", static_cast<long long>(c.limit_m), at);
    if (!k || !v || PyDict_SetItem(d, k, v) < 0) {
      Py_XDECREF(k);
      Py_XDECREF(v);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(k);
    Py_DECREF(v);
  }
  return d;
}

PyMethodDef linear_methods[] = {
    {"forget", linear_forget, METH_NOARGS, "forget every shape's rule (after the table changed)"},
    {"remembered", linear_remembered, METH_NOARGS, "{(device, N, K): (limit_m, {M: F.linear in both regimes})}"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject LinearType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- the capture counter --------------------------------------------------------------------------------------

PyObject* capture_enter(PyObject*, PyObject*) {
  ++capture_depth;
  Py_RETURN_NONE;
}

PyObject* capture_exit(PyObject*, PyObject*) {
  if (capture_depth > 0) --capture_depth;
  Py_RETURN_NONE;
}

PyObject* capture_depth_now(PyObject*, PyObject*) { return PyLong_FromLongLong(capture_depth); }

PyMethodDef module_methods[] = {
    {"capture_enter", capture_enter, METH_NOARGS, "a CUDA graph capture began in this thread"},
    {"capture_exit", capture_exit, METH_NOARGS, "a CUDA graph capture of this thread ended"},
    {"capture_depth", capture_depth_now, METH_NOARGS, "captures open in this thread, as this module counts them"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "blb_bound_linear",
                          "dispatch.bind's bound layer in C++ (bf16-linear-bench)", -1, module_methods};

}  // namespace

PyMODINIT_FUNC PyInit_blb_bound_linear() {
  BoundLinearType.tp_name = "blb_bound_linear.BoundLinear";
  BoundLinearType.tp_basicsize = sizeof(BoundLinear);
  BoundLinearType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  BoundLinearType.tp_doc =
      "BoundLinear(weight, bias, decide, fallback, release_gil=True): dispatch.bind's layer, x -> y; "
      "decide(m) -> (graph, eager entry), an entry (into, alignment) or None for F.linear";
  BoundLinearType.tp_new = bound_new;
  BoundLinearType.tp_dealloc = bound_dealloc;
  BoundLinearType.tp_traverse = bound_traverse;
  BoundLinearType.tp_clear = bound_clear;
  BoundLinearType.tp_call = PyVectorcall_Call;
  BoundLinearType.tp_vectorcall_offset = offsetof(BoundLinear, vectorcall);
  BoundLinearType.tp_methods = bound_methods;
  if (PyType_Ready(&BoundLinearType) < 0) return nullptr;
  LinearType.tp_name = "blb_bound_linear.Linear";
  LinearType.tp_basicsize = sizeof(Linear);
  LinearType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  LinearType.tp_doc =
      "Linear(rule_of, fallback, parameter_type, release_gil=True): dispatch.linear, (x, weight, bias=None) -> y; "
      "rule_of(device, weight) -> (limit_m, f_linear_at), f_linear_at(m) -> whether every regime runs F.linear";
  LinearType.tp_new = linear_new;
  LinearType.tp_dealloc = linear_dealloc;
  LinearType.tp_traverse = linear_traverse;
  LinearType.tp_clear = linear_clear;
  LinearType.tp_call = PyVectorcall_Call;
  LinearType.tp_vectorcall_offset = offsetof(Linear, vectorcall);
  LinearType.tp_methods = linear_methods;
  if (PyType_Ready(&LinearType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  for (auto [name, type] : {std::pair<const char*, PyTypeObject*>{"BoundLinear", &BoundLinearType},
                            std::pair<const char*, PyTypeObject*>{"Linear", &LinearType}}) {
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, reinterpret_cast<PyObject*>(type)) < 0) {
      Py_DECREF(type);
      Py_DECREF(m);
      return nullptr;
    }
  }
  return m;
}
