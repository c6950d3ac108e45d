/* nbxcert's kernel launcher: one small CPython extension that launches any compiled kernel through the driver's
 * cuLaunchKernelEx, whatever its parameter list.
 *
 * Triton builds one C launcher per kernel signature with a C compiler (at first use, into its cache). nbxcert builds
 * this module once per machine and Python (`launcher.py`), and describes each kernel's parameters by a string of type
 * codes instead, so a kernel loaded from a bundle launches with no compiler run:
 *
 *   P  a device pointer (an int; None is 0)    i/I  int32 / uint32     l/L  int64 / uint64
 *   b/B  int8 / uint8    h/H  int16 / uint16    f  float32    d  float64    e  float16    g  bfloat16 (truncated, as
 *   Triton packs it)     T  a CUtensorMap: the int address of its 128 bytes, or Triton's own tensor map object
 *   -  a value the kernel does not take (a constexpr in Triton's launcher arguments): skipped
 *
 * Every value is converted and range-checked before anything is launched; a bad one raises TypeError or
 * OverflowError naming its position. The driver's status comes back as an int (0: queued): the caller names the
 * kernel in its error. The driver's cuLaunchKernelEx is not linked: `bind` gives its address (the libcuda nbxcert
 * loaded, or a test's stand-in), and the type of Triton's tensor map objects when there is one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

typedef CUresult (*launch_ex_t)(const CUlaunchConfig *config, CUfunction f, void **params, void **extra);

#define MAX_PARAMS 512
#define MAX_MAPS 32

/* the layout of Triton's PyCUtensorMap (triton/backends/nvidia/driver.c): the map follows the object's head, 128-byte
 * aligned */
typedef struct {
  PyObject_HEAD;
  _Alignas(128) CUtensorMap tensorMap;
} TritonTensorMap;

static launch_ex_t launch_ex = NULL;
static PyObject *tensor_map_type = NULL;

static PyObject *bind(PyObject *self, PyObject *args) {
  unsigned long long address;
  PyObject *map_type = Py_None;
  if (!PyArg_ParseTuple(args, "K|O", &address, &map_type))
    return NULL;
  launch_ex = (launch_ex_t)(uintptr_t)address;
  Py_XDECREF(tensor_map_type);
  tensor_map_type = map_type == Py_None ? NULL : map_type;
  Py_XINCREF(tensor_map_type);
  Py_RETURN_NONE;
}

static int out_of_range(Py_ssize_t i, char code) {
  PyErr_Format(PyExc_OverflowError, "kernel parameter %zd (type code '%c') is out of its type's range", i, code);
  return -1;
}

static int signed_value(PyObject *v, Py_ssize_t i, char code, long long lo, long long hi, long long *out) {
  if (!PyLong_Check(v)) {
    PyErr_Format(PyExc_TypeError, "kernel parameter %zd (type code '%c') must be an int, not %s", i, code,
                 Py_TYPE(v)->tp_name);
    return -1;
  }
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow || x < lo || x > hi)
    return out_of_range(i, code);
  *out = x;
  return 0;
}

static int unsigned_value(PyObject *v, Py_ssize_t i, char code, unsigned long long hi, unsigned long long *out) {
  if (v == Py_None && code == 'P') {
    *out = 0;
    return 0;
  }
  if (!PyLong_Check(v)) {
    PyErr_Format(PyExc_TypeError, "kernel parameter %zd (type code '%c') must be an int, not %s", i, code,
                 Py_TYPE(v)->tp_name);
    return -1;
  }
  unsigned long long x = PyLong_AsUnsignedLongLong(v);
  if (x == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return out_of_range(i, code);
  }
  if (x > hi)
    return out_of_range(i, code);
  *out = x;
  return 0;
}

static int float_value(PyObject *v, Py_ssize_t i, char code, double *out) {
  double x = PyFloat_AsDouble(v);
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "kernel parameter %zd (type code '%c') must be a number, not %s", i, code,
                 Py_TYPE(v)->tp_name);
    return -1;
  }
  *out = x;
  return 0;
}

/* Convert `n` values by their type codes into `slots` (8 bytes each) and tensor maps into `maps`, pointing `params` at
 * them; `patched`/`patch_values` (n_patches of them, or none) replace the values at those positions with addresses.
 * Returns the number of kernel parameters, or -1 with an exception set. */
static Py_ssize_t pack(const char *codes, Py_ssize_t n, PyObject **items, const Py_ssize_t *patched,
                       const uint64_t *patch_values, Py_ssize_t n_patches, uint64_t *slots, void **params,
                       CUtensorMap *maps) {
  int n_maps = 0;
  Py_ssize_t k = 0, next_patch = 0; /* the kernel's parameters filled so far; the next patch (patches are sorted) */
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *v = items[i];
    char code = codes[i];
    long long s;
    unsigned long long u;
    double d;
    if (code == '-')
      continue;
    void *slot = &slots[k];
    params[k++] = slot;
    slots[k - 1] = 0;
    if (next_patch < n_patches && patched[next_patch] == i) {
      *(uint64_t *)slot = patch_values[next_patch++];
      continue;
    }
    switch (code) {
    case 'P':
    case 'L':
      if (unsigned_value(v, i, code, UINT64_MAX, &u))
        return -1;
      *(uint64_t *)slot = u;
      break;
    case 'I':
      if (unsigned_value(v, i, code, UINT32_MAX, &u))
        return -1;
      *(uint32_t *)slot = (uint32_t)u;
      break;
    case 'H':
      if (unsigned_value(v, i, code, UINT16_MAX, &u))
        return -1;
      *(uint16_t *)slot = (uint16_t)u;
      break;
    case 'B':
      if (unsigned_value(v, i, code, UINT8_MAX, &u))
        return -1;
      *(uint8_t *)slot = (uint8_t)u;
      break;
    case 'l':
      if (signed_value(v, i, code, INT64_MIN, INT64_MAX, &s))
        return -1;
      *(int64_t *)slot = s;
      break;
    case 'i':
      if (signed_value(v, i, code, INT32_MIN, INT32_MAX, &s))
        return -1;
      *(int32_t *)slot = (int32_t)s;
      break;
    case 'h':
      if (signed_value(v, i, code, INT16_MIN, INT16_MAX, &s))
        return -1;
      *(int16_t *)slot = (int16_t)s;
      break;
    case 'b':
      if (PyBool_Check(v)) { /* a Triton i1 is passed as a bool */
        *(int8_t *)slot = v == Py_True;
        break;
      }
      if (signed_value(v, i, code, INT8_MIN, INT8_MAX, &s))
        return -1;
      *(int8_t *)slot = (int8_t)s;
      break;
    case 'f': {
      if (float_value(v, i, code, &d))
        return -1;
      float f = (float)d;
      memcpy(slot, &f, sizeof f);
      break;
    }
    case 'd':
      if (float_value(v, i, code, &d))
        return -1;
      memcpy(slot, &d, sizeof d);
      break;
    case 'e':
      if (float_value(v, i, code, &d))
        return -1;
#if PY_VERSION_HEX >= 0x030B00A1
      if (PyFloat_Pack2(d, (char *)slot, 1))
#else
      if (_PyFloat_Pack2(d, (unsigned char *)slot, 1))
#endif
        return -1;
      break;
    case 'g': {
      if (float_value(v, i, code, &d))
        return -1;
      float f = (float)d;
      uint32_t bits;
      memcpy(&bits, &f, sizeof bits);
      *(uint16_t *)slot = (uint16_t)(bits >> 16);
      break;
    }
    case 'T': {
      if (n_maps == MAX_MAPS) {
        PyErr_Format(PyExc_ValueError, "launch: more than %d tensor maps", MAX_MAPS);
        return -1;
      }
      const void *map;
      if (PyLong_Check(v)) {
        map = (const void *)(uintptr_t)PyLong_AsUnsignedLongLong(v);
        if (PyErr_Occurred())
          return -1;
      } else if (tensor_map_type != NULL && (PyObject *)Py_TYPE(v) == tensor_map_type) {
        map = &((TritonTensorMap *)v)->tensorMap;
      } else {
        PyErr_Format(PyExc_TypeError, "kernel parameter %zd (a tensor map) must be an address or Triton's tensor map, "
                     "not %s", i, Py_TYPE(v)->tp_name);
        return -1;
      }
      if (map == NULL) {
        PyErr_Format(PyExc_ValueError, "kernel parameter %zd (a tensor map) is at address 0", i);
        return -1;
      }
      memcpy(&maps[n_maps], map, sizeof(CUtensorMap));
      params[k - 1] = &maps[n_maps++];
      break;
    }
    default:
      PyErr_Format(PyExc_ValueError, "kernel parameter %zd has an unknown type code '%c'", i, code);
      return -1;
    }
  }
  return k;
}

/* Queue one kernel: the grid's x times num_ctas (a cluster of num_ctas), 32 x num_warps threads given as `threads`;
 * flags: 1 cooperative grid, 2 programmatic stream serialization (PDL). An empty grid queues nothing. */
static CUresult queue(unsigned long long function, long gx, long gy, long gz, long threads, long num_ctas, long shared,
                      unsigned long long stream, long flags, void **params) {
  if (gx <= 0 || gy <= 0 || gz <= 0)
    return CUDA_SUCCESS;
  CUlaunchAttribute attrs[4];
  unsigned int n_attrs = 0;
  if (flags & 2) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
    n_attrs++;
  }
  if (flags & 1) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n_attrs].value.cooperative = 1;
    n_attrs++;
  }
  if (num_ctas != 1) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n_attrs].value.clusterDim.x = (unsigned int)num_ctas;
    attrs[n_attrs].value.clusterDim.y = 1;
    attrs[n_attrs].value.clusterDim.z = 1;
    n_attrs++;
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n_attrs].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
    n_attrs++;
  }
  CUlaunchConfig config;
  memset(&config, 0, sizeof config);
  config.gridDimX = (unsigned int)(gx * num_ctas);
  config.gridDimY = (unsigned int)gy;
  config.gridDimZ = (unsigned int)gz;
  config.blockDimX = (unsigned int)threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = (unsigned int)shared;
  config.hStream = (CUstream)(uintptr_t)stream;
  config.attrs = attrs;
  config.numAttrs = n_attrs;
  CUresult status;
  Py_BEGIN_ALLOW_THREADS;
  status = launch_ex(&config, (CUfunction)(uintptr_t)function, params, NULL);
  Py_END_ALLOW_THREADS;
  return status;
}

static int check_bound(void) {
  if (launch_ex == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "nbxcert's launcher has no driver bound (bind was not called)");
    return -1;
  }
  return 0;
}

/* launch(function, grid_x, grid_y, grid_z, threads, num_ctas, shared, stream, flags, codes, values) -> CUresult */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 11) {
    PyErr_Format(PyExc_TypeError, "launch takes 11 arguments (%zd given)", nargs);
    return NULL;
  }
  if (check_bound())
    return NULL;
  unsigned long long function = PyLong_AsUnsignedLongLong(args[0]);
  long gx = PyLong_AsLong(args[1]), gy = PyLong_AsLong(args[2]), gz = PyLong_AsLong(args[3]);
  long threads = PyLong_AsLong(args[4]), num_ctas = PyLong_AsLong(args[5]), shared = PyLong_AsLong(args[6]);
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[7]);
  long flags = PyLong_AsLong(args[8]);
  if (PyErr_Occurred())
    return NULL;
  if (!PyBytes_Check(args[9])) {
    PyErr_SetString(PyExc_TypeError, "launch: the type codes must be bytes");
    return NULL;
  }
  const char *codes = PyBytes_AS_STRING(args[9]);
  Py_ssize_t n = PyBytes_GET_SIZE(args[9]);
  PyObject *seq = PySequence_Fast(args[10], "launch: the values must be a list or a tuple");
  if (seq == NULL)
    return NULL;
  if (PySequence_Fast_GET_SIZE(seq) != n || n > MAX_PARAMS) {
    PyErr_Format(PyExc_ValueError, "launch: %zd type codes for %zd values (at most %d)", n,
                 PySequence_Fast_GET_SIZE(seq), MAX_PARAMS);
    Py_DECREF(seq);
    return NULL;
  }
  uint64_t slots[MAX_PARAMS];
  void *params[MAX_PARAMS];
  static _Thread_local CUtensorMap maps[MAX_MAPS];
  Py_ssize_t k = pack(codes, n, PySequence_Fast_ITEMS(seq), NULL, NULL, 0, slots, params, maps);
  Py_DECREF(seq);
  if (k < 0)
    return NULL;
  return PyLong_FromLong((long)queue(function, gx, gy, gz, threads, num_ctas, shared, stream, flags, params));
}

/* launch_plan(steps, addresses, start) -> (CUresult, index of the step it came from)
 * Each step: (function, grid_x, grid_y, grid_z, threads, num_ctas, shared, stream, flags, codes, template, patches),
 * patches a tuple of (position, source, offset) sorted by position: the value at `position` is addresses[source] +
 * offset. The steps from `start` on are queued in order; the first failing status stops them. */
static PyObject *launch_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]) || !PyList_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "launch_plan(steps: tuple, addresses: list, start: int)");
    return NULL;
  }
  if (check_bound())
    return NULL;
  Py_ssize_t start = PyLong_AsSsize_t(args[2]);
  if (start < 0 && PyErr_Occurred())
    return NULL;
  PyObject *steps = args[0], *addresses = args[1];
  Py_ssize_t n_steps = PyTuple_GET_SIZE(steps), n_addresses = PyList_GET_SIZE(addresses);
  uint64_t slots[MAX_PARAMS];
  void *params[MAX_PARAMS];
  static _Thread_local CUtensorMap maps[MAX_MAPS];
  Py_ssize_t patched[MAX_PARAMS];
  uint64_t patch_values[MAX_PARAMS];
  for (Py_ssize_t s = start; s < n_steps; s++) {
    PyObject *step = PyTuple_GET_ITEM(steps, s);
    if (!PyTuple_Check(step) || PyTuple_GET_SIZE(step) != 12) {
      PyErr_Format(PyExc_TypeError, "launch_plan: step %zd is not a 12-tuple", s);
      return NULL;
    }
    PyObject **f = &PyTuple_GET_ITEM(step, 0);
    unsigned long long function = PyLong_AsUnsignedLongLong(f[0]);
    long gx = PyLong_AsLong(f[1]), gy = PyLong_AsLong(f[2]), gz = PyLong_AsLong(f[3]);
    long threads = PyLong_AsLong(f[4]), num_ctas = PyLong_AsLong(f[5]), shared = PyLong_AsLong(f[6]);
    unsigned long long stream = PyLong_AsUnsignedLongLong(f[7]);
    long flags = PyLong_AsLong(f[8]);
    if (PyErr_Occurred())
      return NULL;
    if (!PyBytes_Check(f[9]) || !PyList_Check(f[10]) || !PyTuple_Check(f[11])) {
      PyErr_Format(PyExc_TypeError, "launch_plan: step %zd needs codes (bytes), a template (list), patches (tuple)",
                   s);
      return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(f[9]), n_patches = PyTuple_GET_SIZE(f[11]);
    if (PyList_GET_SIZE(f[10]) != n || n > MAX_PARAMS || n_patches > n) {
      PyErr_Format(PyExc_ValueError, "launch_plan: step %zd has %zd codes for %zd values", s, n,
                   PyList_GET_SIZE(f[10]));
      return NULL;
    }
    for (Py_ssize_t p = 0; p < n_patches; p++) {
      PyObject *patch = PyTuple_GET_ITEM(f[11], p);
      Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(patch, 0));
      Py_ssize_t source = PyLong_AsSsize_t(PyTuple_GET_ITEM(patch, 1));
      unsigned long long offset = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(patch, 2));
      if (PyErr_Occurred())
        return NULL;
      if (source < 0 || source >= n_addresses || position < 0 || position >= n ||
          (p > 0 && position <= patched[p - 1])) {
        PyErr_Format(PyExc_ValueError, "launch_plan: step %zd has a bad patch %zd", s, p);
        return NULL;
      }
      unsigned long long base = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(addresses, source));
      if (PyErr_Occurred())
        return NULL;
      patched[p] = position;
      patch_values[p] = base + offset;
    }
    if (pack(PyBytes_AS_STRING(f[9]), n, PySequence_Fast_ITEMS(f[10]), patched, patch_values, n_patches, slots,
             params, maps) < 0)
      return NULL;
    CUresult status = queue(function, gx, gy, gz, threads, num_ctas, shared, stream, flags, params);
    if (status != CUDA_SUCCESS)
      return Py_BuildValue("(in)", (int)status, s);
  }
  return Py_BuildValue("(in)", 0, n_steps);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(cuLaunchKernelEx address, tensor map type or None)"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, gx, gy, gz, threads, num_ctas, shared, stream, flags, codes, values) -> CUresult"},
    {"launch_plan", (PyCFunction)(void (*)(void))launch_plan, METH_FASTCALL,
     "launch_plan(steps, addresses, start) -> (CUresult, step index)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nbxcert_launcher", NULL, -1, methods};

PyMODINIT_FUNC PyInit__nbxcert_launcher(void) { return PyModule_Create(&module); }
