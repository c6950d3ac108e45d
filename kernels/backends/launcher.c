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
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuda.h"
#include "structmember.h"

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

/* A copy of `template` with each TMA descriptor's launcher arguments in place: `descriptors` holds (position, width,
 * source, offset, kept, fill) each; the descriptor is over addresses[source] + offset, and its arguments are
 * kept[address], or fill(address) (which encodes and keeps them) the first time. */
static PyObject *with_descriptors(PyObject *template, PyObject *descriptors, PyObject *addresses, Py_ssize_t s) {
  PyObject *values = PyList_GetSlice(template, 0, PyList_GET_SIZE(template));
  if (values == NULL)
    return NULL;
  for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(descriptors); d++) {
    PyObject *desc = PyTuple_GET_ITEM(descriptors, d);
    if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 6 || !PyDict_Check(PyTuple_GET_ITEM(desc, 4))) {
      PyErr_Format(PyExc_TypeError, "launch_plan: step %zd has a bad descriptor %zd", s, d);
      goto failed;
    }
    Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 0));
    Py_ssize_t width = PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 1));
    Py_ssize_t source = PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 2));
    unsigned long long offset = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(desc, 3));
    if (PyErr_Occurred())
      goto failed;
    if (source < 0 || source >= PyList_GET_SIZE(addresses) || position < 0 || width < 0 ||
        position + width > PyList_GET_SIZE(values)) {
      PyErr_Format(PyExc_ValueError, "launch_plan: step %zd has a bad descriptor %zd", s, d);
      goto failed;
    }
    unsigned long long base = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(addresses, source));
    if (PyErr_Occurred())
      goto failed;
    PyObject *address = PyLong_FromUnsignedLongLong(base + offset);
    if (address == NULL)
      goto failed;
    PyObject *expanded = PyDict_GetItemWithError(PyTuple_GET_ITEM(desc, 4), address);
    if (expanded != NULL)
      Py_INCREF(expanded);
    else if (!PyErr_Occurred())
      expanded = PyObject_CallOneArg(PyTuple_GET_ITEM(desc, 5), address);
    Py_DECREF(address);
    if (expanded == NULL)
      goto failed;
    if (!PyList_Check(expanded) || PyList_GET_SIZE(expanded) != width) {
      Py_DECREF(expanded);
      PyErr_Format(PyExc_ValueError, "launch_plan: step %zd's descriptor %zd is not %zd arguments", s, d, width);
      goto failed;
    }
    for (Py_ssize_t i = 0; i < width; i++) {
      PyObject *item = PyList_GET_ITEM(expanded, i);
      Py_INCREF(item);
      PyList_SetItem(values, position + i, item);
    }
    Py_DECREF(expanded);
  }
  return values;
failed:
  Py_DECREF(values);
  return NULL;
}

/* One step of a plan (see launch_plan), read: its launch figures into *fig and its parameters packed into `slots`,
 * `params` and `maps` with this call's addresses patched in. *holds_map: the step passes a tensor map (a 'T' value
 * or a descriptor). Returns the number of kernel parameters, or -1 with an exception set. */
typedef struct {
  unsigned long long function, stream;
  long gx, gy, gz, threads, num_ctas, shared, flags;
} StepFigures;

static Py_ssize_t read_step(PyObject *steps, Py_ssize_t s, PyObject *addresses, StepFigures *fig, uint64_t *slots,
                            void **params, CUtensorMap *maps, int *holds_map) {
  Py_ssize_t n_addresses = PyList_GET_SIZE(addresses);
  Py_ssize_t patched[MAX_PARAMS];
  uint64_t patch_values[MAX_PARAMS];
  PyObject *step = PyTuple_GET_ITEM(steps, s);
  if (!PyTuple_Check(step) || (PyTuple_GET_SIZE(step) != 12 && PyTuple_GET_SIZE(step) != 13)) {
    PyErr_Format(PyExc_TypeError, "launch_plan: step %zd is not a 12- or 13-tuple", s);
    return -1;
  }
  PyObject **f = &PyTuple_GET_ITEM(step, 0);
  fig->function = PyLong_AsUnsignedLongLong(f[0]);
  fig->gx = PyLong_AsLong(f[1]), fig->gy = PyLong_AsLong(f[2]), fig->gz = PyLong_AsLong(f[3]);
  fig->threads = PyLong_AsLong(f[4]), fig->num_ctas = PyLong_AsLong(f[5]), fig->shared = PyLong_AsLong(f[6]);
  fig->stream = PyLong_AsUnsignedLongLong(f[7]);
  fig->flags = PyLong_AsLong(f[8]);
  if (PyErr_Occurred())
    return -1;
  if (!PyBytes_Check(f[9]) || !PyList_Check(f[10]) || !PyTuple_Check(f[11])) {
    PyErr_Format(PyExc_TypeError, "launch_plan: step %zd needs codes (bytes), a template (list), patches (tuple)", s);
    return -1;
  }
  Py_ssize_t n = PyBytes_GET_SIZE(f[9]), n_patches = PyTuple_GET_SIZE(f[11]);
  if (PyList_GET_SIZE(f[10]) != n || n > MAX_PARAMS || n_patches > n) {
    PyErr_Format(PyExc_ValueError, "launch_plan: step %zd has %zd codes for %zd values", s, n, PyList_GET_SIZE(f[10]));
    return -1;
  }
  for (Py_ssize_t p = 0; p < n_patches; p++) {
    PyObject *patch = PyTuple_GET_ITEM(f[11], p);
    Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(patch, 0));
    Py_ssize_t source = PyLong_AsSsize_t(PyTuple_GET_ITEM(patch, 1));
    unsigned long long offset = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(patch, 2));
    if (PyErr_Occurred())
      return -1;
    if (source < 0 || source >= n_addresses || position < 0 || position >= n ||
        (p > 0 && position <= patched[p - 1])) {
      PyErr_Format(PyExc_ValueError, "launch_plan: step %zd has a bad patch %zd", s, p);
      return -1;
    }
    unsigned long long base = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(addresses, source));
    if (PyErr_Occurred())
      return -1;
    patched[p] = position;
    patch_values[p] = base + offset;
  }
  PyObject *values = NULL; /* the template with this call's descriptors in place, where the step has any */
  if (PyTuple_GET_SIZE(step) == 13 && PyTuple_Check(f[12]) && PyTuple_GET_SIZE(f[12]) > 0) {
    values = with_descriptors(f[10], f[12], addresses, s);
    if (values == NULL)
      return -1;
  }
  *holds_map = values != NULL || memchr(PyBytes_AS_STRING(f[9]), 'T', (size_t)n) != NULL;
  Py_ssize_t packed = pack(PyBytes_AS_STRING(f[9]), n, PySequence_Fast_ITEMS(values ? values : f[10]), patched,
                           patch_values, n_patches, slots, params, maps);
  Py_XDECREF(values);
  return packed;
}

/* --- a plan's launches as one CUDA graph -----------------------------------------------------------------------------
 * Each launch costs the driver's cuLaunchKernelEx on the host (4-6 us each on an H200's host), so a plan of several
 * launches cannot be served in 10 us launch by launch. Queued as one CUDA graph of the same kernels in the same order,
 * a replay costs one cuGraphLaunch, plus one cuGraphExecKernelNodeSetParams per kernel whose parameters differ from
 * its last replay's (a call's addresses: the blocks kept per stream come back, so most replays update nothing). The
 * graph is made at the plan's first replay and kept with the plan (`holder`, a one-item list the plan owns). A step a
 * kernel node does not hold as it is (a cluster, a cooperative or PDL launch, a tensor map, an empty grid, another
 * stream) keeps the plan on its launches; so does a stream being captured into a graph (the capture records the
 * launches themselves). bind_graphs gives the driver's graph functions; unbound, plans are launched step by step. */
typedef CUresult (*graph_create_t)(CUgraph *, unsigned int);
typedef CUresult (*graph_add_kernel_t)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                       const CUDA_KERNEL_NODE_PARAMS *);
typedef CUresult (*graph_instantiate_t)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*graph_launch_t)(CUgraphExec, CUstream);
typedef CUresult (*graph_set_kernel_t)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *);
typedef CUresult (*stream_is_capturing_t)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*graph_exec_destroy_t)(CUgraphExec);
typedef CUresult (*graph_destroy_t)(CUgraph);

static struct {
  graph_create_t create;
  graph_add_kernel_t add_kernel;
  graph_instantiate_t instantiate;
  graph_launch_t launch;
  graph_set_kernel_t set_kernel;
  stream_is_capturing_t is_capturing;
  graph_exec_destroy_t exec_destroy;
  graph_destroy_t destroy;
} G;
static int graphs_bound = 0;

#define MAX_GRAPH_STEPS 16
#define MAX_GRAPH_PARAMS 128

typedef struct {
  CUgraph graph;
  CUgraphExec exec;
  Py_ssize_t n;
  CUgraphNode nodes[MAX_GRAPH_STEPS];
  Py_ssize_t n_params[MAX_GRAPH_STEPS];
  uint64_t last[MAX_GRAPH_STEPS][MAX_GRAPH_PARAMS]; /* each node's parameters as last set */
  long pid;                                          /* the process that made it (a forked child frees nothing) */
} PlanGraph;

static const char *PLAN_GRAPH = "nbxcert plan graph";

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

static void free_plan_graph(PlanGraph *pg) {
  if (pg->pid == (long)getpid() && graphs_bound && !finalizing()) {
    /* an in-flight graph is freed by the driver once its work is done */
    if (pg->exec != NULL)
      G.exec_destroy(pg->exec);
    if (pg->graph != NULL)
      G.destroy(pg->graph);
  }
  PyMem_Free(pg);
}

static void plan_graph_capsule_free(PyObject *capsule) {
  PlanGraph *pg = (PlanGraph *)PyCapsule_GetPointer(capsule, PLAN_GRAPH);
  if (pg != NULL)
    free_plan_graph(pg);
  else
    PyErr_Clear();
}

static PyObject *bind_graphs(PyObject *self, PyObject *args) {
  unsigned long long a[8];
  if (!PyArg_ParseTuple(args, "KKKKKKKK", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7]))
    return NULL;
  G.create = (graph_create_t)(uintptr_t)a[0];
  G.add_kernel = (graph_add_kernel_t)(uintptr_t)a[1];
  G.instantiate = (graph_instantiate_t)(uintptr_t)a[2];
  G.launch = (graph_launch_t)(uintptr_t)a[3];
  G.set_kernel = (graph_set_kernel_t)(uintptr_t)a[4];
  G.is_capturing = (stream_is_capturing_t)(uintptr_t)a[5];
  G.exec_destroy = (graph_exec_destroy_t)(uintptr_t)a[6];
  G.destroy = (graph_destroy_t)(uintptr_t)a[7];
  graphs_bound = 1;
  for (int i = 0; i < 8; i++)
    graphs_bound &= a[i] != 0;
  Py_RETURN_NONE;
}

static void node_params(CUDA_KERNEL_NODE_PARAMS *kp, const StepFigures *fig, void **params) {
  memset(kp, 0, sizeof *kp);
  kp->func = (CUfunction)(uintptr_t)fig->function;
  kp->gridDimX = (unsigned int)fig->gx;
  kp->gridDimY = (unsigned int)fig->gy;
  kp->gridDimZ = (unsigned int)fig->gz;
  kp->blockDimX = (unsigned int)fig->threads;
  kp->blockDimY = 1;
  kp->blockDimZ = 1;
  kp->sharedMemBytes = (unsigned int)fig->shared;
  kp->kernelParams = params;
}

/* The plan's steps queued as one graph launch (see above): 1 with *status and *at set (at: the step whose update
 * failed, else 0); 0 where the plan is to be launched step by step instead; -1 with an exception set. The GIL is held
 * throughout: a plan's graph is updated and launched by one thread at a time. */
static int run_graph(PyObject *steps, PyObject *addresses, PyObject *holder, CUresult *status_out, Py_ssize_t *at) {
  Py_ssize_t n_steps = PyTuple_GET_SIZE(steps);
  if (!graphs_bound || n_steps < 2 || n_steps > MAX_GRAPH_STEPS || !PyList_Check(holder) ||
      PyList_GET_SIZE(holder) != 1)
    return 0;
  static _Thread_local uint64_t slots[MAX_GRAPH_STEPS][MAX_PARAMS];
  static _Thread_local void *params[MAX_GRAPH_STEPS][MAX_PARAMS];
  static _Thread_local CUtensorMap maps[MAX_MAPS];
  StepFigures figs[MAX_GRAPH_STEPS];
  Py_ssize_t n_params[MAX_GRAPH_STEPS];
  for (Py_ssize_t s = 0; s < n_steps; s++) {
    int holds_map = 0;
    Py_ssize_t k = read_step(steps, s, addresses, &figs[s], slots[s], params[s], maps, &holds_map);
    if (k < 0)
      return -1;
    const StepFigures *g = &figs[s];
    if (holds_map || k > MAX_GRAPH_PARAMS || g->flags != 0 || g->num_ctas != 1 || g->gx <= 0 || g->gy <= 0 ||
        g->gz <= 0 || g->stream != figs[0].stream)
      return 0;
    n_params[s] = k;
  }
  CUstream stream = (CUstream)(uintptr_t)figs[0].stream;
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult status = G.is_capturing(stream, &capturing);
  if (status != CUDA_SUCCESS) {
    *status_out = status;
    *at = 0;
    return 1;
  }
  if (capturing != CU_STREAM_CAPTURE_STATUS_NONE)
    return 0;
  CUDA_KERNEL_NODE_PARAMS kp;
  PyObject *kept = PyList_GET_ITEM(holder, 0);
  PlanGraph *pg;
  if (kept == Py_None) {
    pg = (PlanGraph *)PyMem_Calloc(1, sizeof(PlanGraph));
    if (pg == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    pg->n = n_steps;
    pg->pid = (long)getpid();
    status = G.create(&pg->graph, 0);
    for (Py_ssize_t s = 0; s < n_steps && status == CUDA_SUCCESS; s++) {
      node_params(&kp, &figs[s], params[s]);
      status = G.add_kernel(&pg->nodes[s], pg->graph, s ? &pg->nodes[s - 1] : NULL, s ? 1 : 0, &kp);
      pg->n_params[s] = n_params[s];
      memcpy(pg->last[s], slots[s], (size_t)n_params[s] * sizeof(uint64_t));
    }
    if (status == CUDA_SUCCESS)
      status = G.instantiate(&pg->exec, pg->graph, 0);
    if (status != CUDA_SUCCESS) {
      free_plan_graph(pg);
      *status_out = status;
      *at = 0;
      return 1;
    }
    PyObject *capsule = PyCapsule_New(pg, PLAN_GRAPH, plan_graph_capsule_free);
    if (capsule == NULL) {
      free_plan_graph(pg);
      return -1;
    }
    PyList_SetItem(holder, 0, capsule); /* steals the reference */
  } else {
    pg = (PlanGraph *)PyCapsule_GetPointer(kept, PLAN_GRAPH);
    if (pg == NULL)
      return -1;
    if (pg->n != n_steps) {
      PyErr_Format(PyExc_ValueError, "launch_plan: a plan graph of %zd steps given %zd", pg->n, n_steps);
      return -1;
    }
    for (Py_ssize_t s = 0; s < n_steps; s++) {
      size_t bytes = (size_t)n_params[s] * sizeof(uint64_t);
      if (n_params[s] == pg->n_params[s] && memcmp(pg->last[s], slots[s], bytes) == 0)
        continue;
      node_params(&kp, &figs[s], params[s]);
      status = G.set_kernel(pg->exec, pg->nodes[s], &kp);
      if (status != CUDA_SUCCESS) {
        *status_out = status;
        *at = s;
        return 1;
      }
      pg->n_params[s] = n_params[s];
      memcpy(pg->last[s], slots[s], bytes);
    }
  }
  *status_out = G.launch(pg->exec, stream);
  *at = *status_out == CUDA_SUCCESS ? n_steps : 0;
  return 1;
}

/* Queue the steps of a plan from `start` on (see launch_plan), as one graph where `holder` keeps the plan's graph and
 * the plan can be one (see run_graph). Returns 0 with *status (the first failing status, or 0) and *at (the step it
 * came from, or the number of steps), or -1 with an exception set. */
static int run_plan(PyObject *steps, PyObject *addresses, Py_ssize_t start, PyObject *holder, CUresult *status_out,
                    Py_ssize_t *at) {
  Py_ssize_t n_steps = PyTuple_GET_SIZE(steps);
  if (start == 0 && holder != NULL && holder != Py_None) {
    int done = run_graph(steps, addresses, holder, status_out, at);
    if (done != 0)
      return done < 0 ? -1 : 0;
  }
  uint64_t slots[MAX_PARAMS];
  void *params[MAX_PARAMS];
  static _Thread_local CUtensorMap maps[MAX_MAPS];
  for (Py_ssize_t s = start; s < n_steps; s++) {
    StepFigures fig;
    int holds_map = 0;
    if (read_step(steps, s, addresses, &fig, slots, params, maps, &holds_map) < 0)
      return -1;
    CUresult status = queue(fig.function, fig.gx, fig.gy, fig.gz, fig.threads, fig.num_ctas, fig.shared, fig.stream,
                            fig.flags, params);
    if (status != CUDA_SUCCESS) {
      *status_out = status;
      *at = s;
      return 0;
    }
  }
  *status_out = CUDA_SUCCESS;
  *at = n_steps;
  return 0;
}

/* launch_plan(steps, addresses, start[, graph]) -> (CUresult, index of the step it came from)
 * Each step: (function, grid_x, grid_y, grid_z, threads, num_ctas, shared, stream, flags, codes, template, patches
 * [, descriptors]), patches a tuple of (position, source, offset) sorted by position: the value at `position` is
 * addresses[source] + offset; descriptors as `with_descriptors` reads them. The steps from `start` on are queued in
 * order; the first failing status stops them. `graph`: the plan's one-item list keeping its CUDA graph (see
 * run_graph), or None. */
static PyObject *launch_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if ((nargs != 3 && nargs != 4) || !PyTuple_Check(args[0]) || !PyList_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "launch_plan(steps: tuple, addresses: list, start: int, graph: list | None)");
    return NULL;
  }
  if (check_bound())
    return NULL;
  Py_ssize_t start = PyLong_AsSsize_t(args[2]);
  if (start < 0 && PyErr_Occurred())
    return NULL;
  CUresult status;
  Py_ssize_t at;
  if (run_plan(args[0], args[1], start, nargs == 4 ? args[3] : NULL, &status, &at) < 0)
    return NULL;
  return Py_BuildValue("(in)", (int)status, at);
}

/* ------------------------------------------------------------------------------------------------------------------
 * A served call replayed in C (`launch.served`). The Python entry point hands each call here as (args, kwargs); this
 * forms the call's signature exactly as `launch.call_signature` does, finds the entry point's plan, and where the plan
 * has a fast form (`CallPlan.fast`: every launch packed, no lock, a result of the call's tensors or of memory the plan
 * makes), makes the plan's memory, queues its launches and builds the result, with no Python frame on the way.
 * Anything else (a recording, `config=`, an argument a signature cannot hold, aliased tensors, no plan yet, a plan
 * without a fast form, a profiler's launch hooks) goes to the Python path (`slow(args, kwargs)`), which decides as it
 * always has. `setup` gives the Python objects this reads (the tensor type, the thread states, the fallbacks).
 */
static PyObject *S_tensor_type, *S_dtype_type, *S_rec_state, *S_cuda_tls, *S_tensor_key, *S_current_stream,
    *S_make_current, *S_torch_query, *S_fresh, *S_modules;
static PyObject *str_rec, *str_key, *str_ptr, *str_data_ptr, *str_device, *str_streams, *str_fast, *str_config,
    *str_cuda, *str_alloc, *str_storage, *str_offset, *str_shape, *str_strides, *str_dtype, *str_torch, *str_enter,
    *str_exit, *str_calls, *str_block_ptr;
static int served_ready = 0;

#define MAX_TENSORS 64
#define MAX_PARTS 256

static PyObject *setup(PyObject *self, PyObject *args) {
  PyObject *o[9];
  if (!PyArg_ParseTuple(args, "OOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
    return NULL;
  if (!PyList_Check(o[6]) || PyList_GET_SIZE(o[6]) != 1) {
    PyErr_SetString(PyExc_TypeError, "setup: the torch stream query must be a list of one item");
    return NULL;
  }
  PyObject **slots[9] = {&S_tensor_type, &S_dtype_type, &S_rec_state, &S_cuda_tls, &S_current_stream,
                         &S_make_current, &S_torch_query, &S_tensor_key, &S_fresh};
  for (int i = 0; i < 9; i++) {
    Py_INCREF(o[i]);
    Py_XSETREF(*slots[i], o[i]);
  }
  S_modules = PyImport_GetModuleDict();
  if (str_rec == NULL) {
    const char *names[] = {"rec", "_key", "_ptr", "data_ptr", "device", "streams", "fast", "config", "cuda",
                           "_alloc", "_storage", "_offset", "shape", "_strides", "dtype", "torch",
                           "launch_enter_hook", "launch_exit_hook", "calls", "ptr"};
    PyObject **strs[] = {&str_rec, &str_key, &str_ptr, &str_data_ptr, &str_device, &str_streams, &str_fast,
                         &str_config, &str_cuda, &str_alloc, &str_storage, &str_offset, &str_shape, &str_strides,
                         &str_dtype, &str_torch, &str_enter, &str_exit, &str_calls, &str_block_ptr};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      *strs[i] = PyUnicode_InternFromString(names[i]);
      if (*strs[i] == NULL)
        return NULL;
    }
  }
  served_ready = 1;
  Py_RETURN_NONE;
}

typedef struct {
  PyObject_HEAD PyObject *slow; /* slow(args, kwargs): the Python path */
  PyObject *memo;               /* signature -> CallPlan (or a count of calls tied to their data) */
  Py_ssize_t config_at;         /* the position of `config`, or -1 */
} Served;

static int is_scalar(PyObject *v) {
  PyTypeObject *t = Py_TYPE(v);
  return t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type || t == &PyUnicode_Type || v == Py_None ||
         (PyObject *)t == S_dtype_type;
}

/* the stream of `device` this thread launches on, as `cuda.current_stream` gives it (new reference) */
static PyObject *current_stream(long device) {
  PyObject *streams = PyObject_GetAttr(S_cuda_tls, str_streams);
  if (streams == NULL)
    return NULL;
  int set = streams != Py_None && (!PyDict_Check(streams) || PyDict_GET_SIZE(streams) > 0);
  Py_DECREF(streams);
  if (!set && PyList_GET_ITEM(S_torch_query, 0) == Py_None && PyDict_GetItem(S_modules, str_torch) == NULL)
    return PyLong_FromLong(0);
  PyObject *index = PyLong_FromLong(device);
  if (index == NULL)
    return NULL;
  PyObject *stream = PyObject_CallOneArg(S_current_stream, index);
  Py_DECREF(index);
  return stream;
}

/* 1: a launch hook that wants Triton's metadata is set (the Python path gives it); 0: none; -1: error */
static int hooked(PyObject *hooks) {
  if (hooks == Py_None)
    return 0;
  PyObject *knobs = PyTuple_GET_ITEM(hooks, 0), *chain = PyTuple_GET_ITEM(hooks, 1);
  PyObject *names[2] = {str_enter, str_exit};
  for (int i = 0; i < 2; i++) {
    PyObject *hook = PyObject_GetAttr(knobs, names[i]);
    if (hook == NULL)
      return -1;
    int wants = 0;
    if (hook != Py_None) {
      if ((PyObject *)Py_TYPE(hook) != chain) {
        wants = 1;
      } else {
        PyObject *calls = PyObject_GetAttr(hook, str_calls);
        wants = calls == NULL ? -1 : PyObject_IsTrue(calls);
        Py_XDECREF(calls);
      }
    }
    Py_DECREF(hook);
    if (wants)
      return wants;
  }
  return 0;
}

static int set_attr(PyObject *o, PyObject *name, PyObject *value) {
  int failed = PyObject_SetAttr(o, name, value);
  Py_DECREF(value);
  return failed;
}

/* the result of a replay from its fast form: (0, i) the call's tensor i; (1, source, offset, shape, strides, dtype,
 * element offset, device type, device index) a tensor over storage `source` the replay made; (2, (forms...)) a
 * tuple; (3, value) a value */
static PyObject *build_result(PyObject *form, PyObject **tensors, Py_ssize_t n_call, PyObject **storages,
                              PyObject *addresses) {
  long kind = PyLong_AsLong(PyTuple_GET_ITEM(form, 0));
  if (kind == 0) {
    PyObject *t = tensors[PyLong_AsSsize_t(PyTuple_GET_ITEM(form, 1))];
    Py_INCREF(t);
    return t;
  }
  if (kind == 2) {
    PyObject *forms = PyTuple_GET_ITEM(form, 1);
    Py_ssize_t n = PyTuple_GET_SIZE(forms);
    PyObject *made = PyTuple_New(n);
    if (made == NULL)
      return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject *item = build_result(PyTuple_GET_ITEM(forms, i), tensors, n_call, storages, addresses);
      if (item == NULL) {
        Py_DECREF(made);
        return NULL;
      }
      PyTuple_SET_ITEM(made, i, item);
    }
    return made;
  }
  if (kind == 3) {
    PyObject *v = PyTuple_GET_ITEM(form, 1);
    Py_INCREF(v);
    return v;
  }
  PyObject **f = &PyTuple_GET_ITEM(form, 0);
  Py_ssize_t source = PyLong_AsSsize_t(f[1]);
  unsigned long long ptr = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(addresses, source)) + PyLong_AsUnsignedLongLong(f[2]);
  if (PyErr_Occurred())
    return NULL;
  PyTypeObject *type = (PyTypeObject *)S_tensor_type;
  PyObject *t = type->tp_alloc(type, 0);
  if (t == NULL)
    return NULL;
  PyObject *key = Py_BuildValue("(OOOKOO)", f[3], f[4], f[5], ptr % 16, f[7], f[8]);
  Py_INCREF(storages[source - n_call]);
  Py_INCREF(f[3]);
  Py_INCREF(f[4]);
  Py_INCREF(f[5]);
  Py_INCREF(f[6]);
  if (key == NULL || set_attr(t, str_storage, storages[source - n_call]) || set_attr(t, str_ptr, PyLong_FromUnsignedLongLong(ptr)) ||
      set_attr(t, str_key, key) || set_attr(t, str_offset, f[6]) || set_attr(t, str_shape, f[3]) ||
      set_attr(t, str_strides, f[4]) || set_attr(t, str_dtype, f[5])) {
    Py_DECREF(t);
    return NULL;
  }
  return t;
}

/* ------------------------------------------------------------------------------------------------------------------
 * Device memory on a served call's replay (`memory.py` is the allocator; this is its fast path). A `Block` is a block
 * of nbxcert's pool as `memory.PoolBlock` is one, made by a replay. When it is dropped or freed, it is kept here for
 * its stream's next allocation of the same size (`KEPT_PER_SIZE` of them, the least recently used size given back to
 * the pool through `memory._give_back` when `KEPT_SIZES_IN_C` sizes are kept), or handed to `memory.pool_free`. A
 * replay takes a kept block of its size and stream first, else asks `memory.pool_block` (its own kept blocks, the
 * pool, out-of-memory handling) and holds what that gives as a `Block`. The allocator's figures are counted here
 * (`count`, `figures`); `drain` gives memory.py the kept blocks back (`release_kept`). During a graph capture
 * (`memory.capturing`), memory.py does everything.
 */
static PyObject *S_memory, *S_cuda, *S_storage_type, *S_pool_block, *S_pool_free, *S_give_back, *S_poolblock_type;
static PyObject *str_capturing, *str_kept_per_size, *str_pid, *str_poisoned, *str_keep, *str_stream, *str_host,
    *str_nbytes, *str_block_pid;
static int memory_ready = 0;

#define KEPT_SIZES_IN_C 32
#define KEPT_MAX 8

typedef struct {
  int used, device, n;
  unsigned long long stream, last;
  Py_ssize_t size;
  unsigned long long ptr[KEPT_MAX];
  PyObject *keep[KEPT_MAX];
} KeptSlot;

static KeptSlot kept_slots[KEPT_SIZES_IN_C];
static unsigned long long kept_clock = 0;

typedef struct {
  PyObject_HEAD unsigned long long ptr; /* 0 once freed */
  Py_ssize_t nbytes;
  int device;
  unsigned long long stream;
  PyObject *keep; /* the stream's `Stream` object (so the stream outlives its memory), or NULL */
  long pid;
} Block;

static PyTypeObject BlockType;

static PyObject *setup_memory(PyObject *self, PyObject *args) {
  PyObject *o[7];
  if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
    return NULL;
  PyObject **slots[7] = {&S_memory, &S_cuda, &S_storage_type, &S_pool_block, &S_pool_free, &S_give_back,
                         &S_poolblock_type};
  for (int i = 0; i < 7; i++) {
    Py_INCREF(o[i]);
    Py_XSETREF(*slots[i], o[i]);
  }
  if (str_capturing == NULL) {
    const char *names[] = {"capturing", "KEPT_PER_SIZE", "_pid", "_poisoned", "keep", "stream", "_host", "nbytes",
                           "pid"};
    PyObject **strs[] = {&str_capturing, &str_kept_per_size, &str_pid, &str_poisoned, &str_keep, &str_stream,
                         &str_host, &str_nbytes, &str_block_pid};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      *strs[i] = PyUnicode_InternFromString(names[i]);
      if (*strs[i] == NULL)
        return NULL;
    }
  }
  memory_ready = 1;
  Py_RETURN_NONE;
}

/* memory.<name> as a C long (-1 with an exception on failure) */
static long module_long(PyObject *module, PyObject *name) {
  PyObject *v = PyObject_GetAttr(module, name);
  if (v == NULL)
    return -1;
  long x = PyLong_AsLong(v);
  Py_DECREF(v);
  return x;
}

/* 1: memory.capturing is set (memory.py does everything); 0: not; -1: error */
static int capturing(void) {
  PyObject *c = PyObject_GetAttr(S_memory, str_capturing);
  if (c == NULL)
    return -1;
  int on = c != Py_None;
  Py_DECREF(c);
  return on;
}

/* whether memory made by process `pid` may be released from here (cuda.owned_here): -1 on error */
static int owned_here(long pid) {
  long here = module_long(S_cuda, str_pid);
  if (here == -1 && PyErr_Occurred())
    return -1;
  PyObject *poisoned = PyObject_GetAttr(S_cuda, str_poisoned);
  if (poisoned == NULL)
    return -1;
  int clean = poisoned == Py_None;
  Py_DECREF(poisoned);
  return pid == here && clean;
}

/* The figures of nbxcert's blocks per device (memory.figures), counted here once memory.bind_launcher has handed
 * them over: every block taken or freed, by a replay here or by memory.py (`count`), is counted under the GIL with no
 * lock and no Python call. */
#define MAX_DEVICES 64
typedef struct {
  long long allocated, peak, count, allocations, frees;
} Figures;
static Figures device_figures[MAX_DEVICES];

static int count_block(int device, Py_ssize_t size, int taken) {
  if (device < 0 || device >= MAX_DEVICES) {
    PyErr_Format(PyExc_ValueError, "nbxcert's launcher counts memory of devices 0 to %d, not %d", MAX_DEVICES - 1,
                 device);
    return -1;
  }
  Figures *f = &device_figures[device];
  if (taken) {
    f->allocated += size;
    f->count++;
    f->allocations++;
    if (f->allocated > f->peak)
      f->peak = f->allocated;
  } else {
    f->allocated -= size;
    f->count--;
    f->frees++;
  }
  return 0;
}

/* count(device, size, taken): one block counted (memory._count) */
static PyObject *count(PyObject *self, PyObject *args) {
  int device, taken;
  Py_ssize_t size;
  if (!PyArg_ParseTuple(args, "inp", &device, &size, &taken) || count_block(device, size, taken) < 0)
    return NULL;
  Py_RETURN_NONE;
}

static int device_index(PyObject *args, int *device) {
  if (!PyArg_ParseTuple(args, "i", device))
    return -1;
  if (*device < 0 || *device >= MAX_DEVICES) {
    PyErr_Format(PyExc_ValueError, "no figures for device %d", *device);
    return -1;
  }
  return 0;
}

/* figures(device) -> (allocated, peak, count, allocations, frees) */
static PyObject *figures(PyObject *self, PyObject *args) {
  int device;
  if (device_index(args, &device) < 0)
    return NULL;
  Figures *f = &device_figures[device];
  return Py_BuildValue("(LLLLL)", f->allocated, f->peak, f->count, f->allocations, f->frees);
}

/* set_figures(device, allocated, peak, count, allocations, frees): the figures counted before the launcher was bound */
static PyObject *set_figures(PyObject *self, PyObject *args) {
  int device;
  Figures f;
  if (!PyArg_ParseTuple(args, "iLLLLL", &device, &f.allocated, &f.peak, &f.count, &f.allocations, &f.frees))
    return NULL;
  if (device < 0 || device >= MAX_DEVICES) {
    PyErr_Format(PyExc_ValueError, "no figures for device %d", device);
    return NULL;
  }
  device_figures[device] = f;
  Py_RETURN_NONE;
}

/* reset_peak(device): the peak starts afresh from what is held now */
static PyObject *reset_peak(PyObject *self, PyObject *args) {
  int device;
  if (device_index(args, &device) < 0)
    return NULL;
  device_figures[device].peak = device_figures[device].allocated;
  Py_RETURN_NONE;
}

static KeptSlot *find_slot(int device, unsigned long long stream, Py_ssize_t size) {
  for (int i = 0; i < KEPT_SIZES_IN_C; i++) {
    KeptSlot *k = &kept_slots[i];
    if (k->used && k->device == device && k->stream == stream && k->size == size)
      return k;
  }
  return NULL;
}

/* give a kept block back to the pool on its stream (memory._give_back); its keep is dropped after */
static int give_back(unsigned long long ptr, int device, unsigned long long stream, Py_ssize_t size, PyObject *keep) {
  PyObject *done = PyObject_CallFunction(S_give_back, "KiKn", ptr, device, stream, size);
  Py_XDECREF(keep);
  if (done == NULL)
    return -1;
  Py_DECREF(done);
  return 0;
}

/* a slot for (device, stream, size), the least recently used one emptied (its blocks given back) when all are used */
static KeptSlot *new_slot(int device, unsigned long long stream, Py_ssize_t size) {
  KeptSlot *oldest = NULL;
  for (int i = 0; i < KEPT_SIZES_IN_C; i++) {
    KeptSlot *k = &kept_slots[i];
    if (!k->used) {
      oldest = k;
      break;
    }
    if (oldest == NULL || k->last < oldest->last)
      oldest = k;
  }
  KeptSlot gone = *oldest;
  /* the slot is claimed before its old blocks are given back: giving back runs Python, and another thread may then
   * free or take blocks here */
  oldest->used = 1;
  oldest->device = device;
  oldest->stream = stream;
  oldest->size = size;
  oldest->n = 0;
  oldest->last = ++kept_clock;
  PyObject *type = NULL, *value = NULL, *trace = NULL;
  for (int j = 0; gone.used && j < gone.n; j++)
    if (give_back(gone.ptr[j], gone.device, gone.stream, gone.size, gone.keep[j]) < 0 && type == NULL)
      PyErr_Fetch(&type, &value, &trace); /* the first error is raised; the rest are still given back */
    else
      PyErr_Clear();
  if (type != NULL) {
    PyErr_Restore(type, value, trace);
    return NULL;
  }
  return oldest;
}

/* the block's memory, freed: kept here for its stream's next allocation of its size, or handed to memory.pool_free */
static int release_block(Block *b) {
  unsigned long long ptr = b->ptr;
  if (!ptr)
    return 0;
  PyObject *keep = b->keep;
  b->ptr = 0;
  b->keep = NULL;
  int owned = owned_here(b->pid);
  if (owned <= 0) { /* a forked child's copy, or a poisoned context: left to process exit */
    Py_XDECREF(keep);
    return owned;
  }
  int held = capturing();
  long per_size = held ? 0 : module_long(S_memory, str_kept_per_size);
  if (held < 0 || (per_size == -1 && PyErr_Occurred())) {
    Py_XDECREF(keep);
    return -1;
  }
  if (per_size > KEPT_MAX)
    per_size = KEPT_MAX;
  if (per_size > 0) {
    KeptSlot *k = find_slot(b->device, b->stream, b->nbytes);
    if (k == NULL)
      k = new_slot(b->device, b->stream, b->nbytes);
    if (k == NULL) {
      Py_XDECREF(keep);
      return -1;
    }
    if (k->n < per_size) {
      k->ptr[k->n] = ptr;
      k->keep[k->n++] = keep;
      k->last = ++kept_clock;
      return count_block(b->device, b->nbytes, 0);
    }
  }
  PyObject *done = PyObject_CallFunction(S_pool_free, "KinlKO", ptr, b->device, b->nbytes, b->pid, b->stream,
                                         keep ? keep : Py_None);
  Py_XDECREF(keep);
  if (done == NULL)
    return -1;
  Py_DECREF(done);
  return 0;
}

static PyObject *Block_free(Block *self, PyObject *unused) {
  if (release_block(self) < 0)
    return NULL;
  Py_RETURN_NONE;
}

static PyObject *Block_data_ptr(Block *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(self->ptr); }

static PyObject *Block_int(Block *self) { return PyLong_FromUnsignedLongLong(self->ptr); }

static PyObject *Block_freed(Block *self, void *unused) { return PyBool_FromLong(self->ptr == 0); }

static PyObject *Block_keep(Block *self, void *unused) {
  PyObject *keep = self->keep ? self->keep : Py_None;
  Py_INCREF(keep);
  return keep;
}

static PyObject *Block_repr(Block *self) {
  if (!self->ptr)
    return PyUnicode_FromFormat("Block(freed, nbytes=%zd, device=%d, stream=%llu)", self->nbytes, self->device,
                                self->stream);
  char text[160];
  snprintf(text, sizeof text, "Block(ptr=0x%llx, nbytes=%zd, device=%d, stream=0x%llx)", self->ptr, self->nbytes,
           self->device, self->stream);
  return PyUnicode_FromString(text);
}

#if PY_VERSION_HEX >= 0x030D0000
#define FINALIZING() Py_IsFinalizing()
#else
#define FINALIZING() _Py_IsFinalizing()
#endif

static void Block_dealloc(Block *self) {
  if (self->ptr && !FINALIZING()) { /* at exit the driver frees every block, as memory.PoolBlock leaves it */
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    if (release_block(self) < 0)
      PyErr_WriteUnraisable((PyObject *)self);
    PyErr_Restore(type, value, trace);
  }
  Py_CLEAR(self->keep);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Block_members[] = {
    {"ptr", T_ULONGLONG, offsetof(Block, ptr), READONLY, "the address; 0 once freed"},
    {"nbytes", T_PYSSIZET, offsetof(Block, nbytes), READONLY, NULL},
    {"device", T_INT, offsetof(Block, device), READONLY, NULL},
    {"stream", T_ULONGLONG, offsetof(Block, stream), READONLY, NULL},
    {"pid", T_LONG, offsetof(Block, pid), READONLY, NULL},
    {NULL},
};

static PyGetSetDef Block_getset[] = {
    {"freed", (getter)Block_freed, NULL, "whether the block was freed", NULL},
    {"keep", (getter)Block_keep, NULL, "the Stream object its stream is kept alive by, or None", NULL},
    {NULL},
};

static PyMethodDef Block_methods[] = {
    {"free", (PyCFunction)Block_free, METH_NOARGS, "give the memory back (idempotent)"},
    {"data_ptr", (PyCFunction)Block_data_ptr, METH_NOARGS, "the address"},
    {NULL},
};

static PyNumberMethods Block_number = {.nb_int = (unaryfunc)Block_int, .nb_index = (unaryfunc)Block_int};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_nbxcert_launcher.Block",
    .tp_basicsize = sizeof(Block),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a block of nbxcert's pool made by a served call's replay (see memory.PoolBlock)",
    .tp_dealloc = (destructor)Block_dealloc,
    .tp_repr = (reprfunc)Block_repr,
    .tp_members = Block_members,
    .tp_getset = Block_getset,
    .tp_methods = Block_methods,
    .tp_as_number = &Block_number,
};

static PyObject *new_block(unsigned long long ptr, Py_ssize_t size, int device, unsigned long long stream,
                           PyObject *keep, long pid) {
  Block *b = PyObject_New(Block, &BlockType);
  if (b == NULL) {
    Py_XDECREF(keep);
    return NULL;
  }
  b->ptr = ptr;
  b->nbytes = size;
  b->device = device;
  b->stream = stream;
  b->keep = keep == Py_None ? NULL : keep;
  if (keep == Py_None)
    Py_DECREF(keep);
  b->pid = pid;
  return (PyObject *)b;
}

/* a storage of `nbytes` on device `device` (`device_obj`, a tensor.Device) for a replay on `stream` (that device's
 * current stream), as tensor.Storage.fresh makes one; `fresh` is Storage.fresh, used during a graph capture */
static PyObject *make_storage(PyObject *nbytes_obj, PyObject *device_obj, long device, PyObject *stream_obj,
                              PyObject *fresh) {
  int held = memory_ready ? capturing() : 1;
  if (held < 0)
    return NULL;
  if (held || stream_obj == NULL)
    return PyObject_CallFunctionObjArgs(fresh, nbytes_obj, device_obj, NULL);
  Py_ssize_t nbytes = PyLong_AsSsize_t(nbytes_obj);
  unsigned long long stream = PyLong_AsUnsignedLongLong(stream_obj);
  if (PyErr_Occurred())
    return NULL;
  Py_ssize_t size = nbytes ? nbytes : 1;
  PyObject *block = NULL;
  KeptSlot *k = find_slot((int)device, stream, size);
  if (k != NULL && k->n > 0) {
    long pid = module_long(S_cuda, str_pid);
    if (pid == -1 && PyErr_Occurred())
      return NULL;
    k->n--;
    k->last = ++kept_clock;
    unsigned long long ptr = k->ptr[k->n];
    PyObject *keep = k->keep[k->n];
    if (count_block((int)device, size, 1) < 0) {
      k->ptr[k->n] = ptr; /* not taken after all */
      k->n++;
      return NULL;
    }
    block = new_block(ptr, size, (int)device, stream, keep ? keep : (Py_INCREF(Py_None), Py_None), pid);
  } else {
    PyObject *made = PyObject_CallFunction(S_pool_block, "nl", size, device);
    if (made == NULL)
      return NULL;
    if ((PyObject *)Py_TYPE(made) != S_poolblock_type) {
      block = made; /* another kind of block (a graph's): held as it is */
    } else { /* the pool's block, held from now on as a Block (kept here when freed) */
      PyObject *ptr = PyObject_GetAttr(made, str_block_ptr), *keep = PyObject_GetAttr(made, str_keep);
      PyObject *pid = PyObject_GetAttr(made, str_block_pid), *on = PyObject_GetAttr(made, str_stream);
      int failed = ptr == NULL || keep == NULL || pid == NULL || on == NULL;
      unsigned long long address = failed ? 0 : PyLong_AsUnsignedLongLong(ptr);
      unsigned long long made_on = failed ? 0 : PyLong_AsUnsignedLongLong(on);
      long made_by = failed ? 0 : PyLong_AsLong(pid);
      if (!failed && !PyErr_Occurred()) {
        PyObject *zero = PyLong_FromLong(0);
        failed = zero == NULL || PyObject_SetAttr(made, str_block_ptr, zero) < 0 ||
                 PyObject_SetAttr(made, str_keep, Py_None) < 0;
        Py_XDECREF(zero);
      }
      Py_XDECREF(ptr);
      Py_XDECREF(pid);
      Py_XDECREF(on);
      Py_DECREF(made);
      if (failed || PyErr_Occurred()) {
        Py_XDECREF(keep);
        return NULL;
      }
      block = new_block(address, size, (int)device, made_on, keep, made_by);
    }
  }
  if (block == NULL)
    return NULL;
  PyTypeObject *type = (PyTypeObject *)S_storage_type;
  PyObject *storage = type->tp_alloc(type, 0);
  if (storage == NULL) {
    Py_DECREF(block);
    return NULL;
  }
  Py_INCREF(device_obj);
  Py_INCREF(nbytes_obj);
  Py_INCREF(Py_None);
  if (set_attr(storage, str_device, device_obj) || set_attr(storage, str_nbytes, nbytes_obj) ||
      set_attr(storage, str_host, Py_None) || set_attr(storage, str_alloc, block)) {
    Py_DECREF(storage);
    return NULL;
  }
  return storage;
}

/* drain(device): the blocks kept here for `device` (-1: every device), taken out: [(ptr, device, stream, size,
 * keep), ...] for memory.release_kept to give back */
static PyObject *drain(PyObject *self, PyObject *args) {
  int device;
  if (!PyArg_ParseTuple(args, "i", &device))
    return NULL;
  PyObject *out = PyList_New(0);
  if (out == NULL)
    return NULL;
  for (int i = 0; i < KEPT_SIZES_IN_C; i++) {
    KeptSlot *k = &kept_slots[i];
    if (!k->used || (device >= 0 && k->device != device))
      continue;
    while (k->n > 0) {
      k->n--;
      PyObject *keep = k->keep[k->n] ? k->keep[k->n] : (Py_INCREF(Py_None), Py_None);
      PyObject *item = Py_BuildValue("(KiKnN)", k->ptr[k->n], k->device, k->stream, k->size, keep);
      if (item == NULL || PyList_Append(out, item) < 0) {
        Py_XDECREF(item);
        Py_DECREF(out);
        return NULL;
      }
      Py_DECREF(item);
    }
    k->used = 0;
  }
  return out;
}

/* the fast form (n_call, made, steps, device, result, hooks, recover, locks, graph) replayed on the call's tensors; NULL with no
 * exception: the Python path is to run */
static PyObject *replay(PyObject *fast, PyObject **tensors, Py_ssize_t n_tensors, PyObject *stream) {
  PyObject **f = &PyTuple_GET_ITEM(fast, 0);
  Py_ssize_t n_call = PyLong_AsSsize_t(f[0]);
  PyObject *made = f[1], *steps = f[2], *device = f[3], *result = f[4], *hooks = f[5], *recover = f[6];
  PyObject *locks = f[7]; /* ((acquire, release), ...) of the persistent buffers' locks the launches share */
  PyObject *graph = f[8]; /* the plan's graph holder (run_graph), or None */
  if (n_call != n_tensors)
    return NULL;
  int wants = hooked(hooks);
  if (wants)
    return NULL; /* -1 leaves its exception set */
  PyObject *current = PyObject_GetAttr(S_cuda_tls, str_device);
  if (current == NULL)
    return NULL;
  int here = current != Py_None && PyObject_RichCompareBool(current, device, Py_EQ) == 1;
  Py_DECREF(current);
  if (!here) {
    PyObject *done = PyObject_CallOneArg(S_make_current, device);
    if (done == NULL)
      return NULL;
    Py_DECREF(done);
  }
  Py_ssize_t n_made = PyTuple_GET_SIZE(made);
  PyObject *storages[MAX_TENSORS];
  if (n_made > MAX_TENSORS)
    return NULL;
  PyObject *addresses = PyList_New(n_call + n_made);
  if (addresses == NULL)
    return NULL;
  Py_ssize_t made_so_far = 0, n_locks = PyTuple_GET_SIZE(locks), held = 0;
  PyObject *out = NULL;
  for (; held < n_locks; held++) {
    PyObject *got = PyObject_CallNoArgs(PyTuple_GET_ITEM(PyTuple_GET_ITEM(locks, held), 0));
    if (got == NULL)
      goto done;
    Py_DECREF(got);
  }
  for (Py_ssize_t i = 0; i < n_call; i++) {
    PyObject *ptr = PyObject_GetAttr(tensors[i], str_ptr);
    if (ptr == Py_None) {
      Py_DECREF(ptr);
      ptr = PyObject_CallMethodNoArgs(tensors[i], str_data_ptr);
    }
    if (ptr == NULL)
      goto done;
    PyList_SET_ITEM(addresses, i, ptr);
  }
  long on_device = PyLong_AsLong(device);
  for (; made_so_far < n_made; made_so_far++) {
    PyObject *m = PyTuple_GET_ITEM(made, made_so_far);
    /* (nbytes, Device, index): a storage on the plan's device is made on this call's stream */
    PyObject *storage = make_storage(PyTuple_GET_ITEM(m, 0), PyTuple_GET_ITEM(m, 1),
                                     PyLong_AsLong(PyTuple_GET_ITEM(m, 2)),
                                     PyLong_AsLong(PyTuple_GET_ITEM(m, 2)) == on_device ? stream : NULL, S_fresh);
    if (storage == NULL)
      goto done;
    storages[made_so_far] = storage;
    PyObject *alloc = PyObject_GetAttr(storage, str_alloc);
    if (alloc == NULL) {
      made_so_far++;
      goto done;
    }
    PyObject *ptr = PyObject_GetAttr(alloc, str_block_ptr);
    Py_DECREF(alloc);
    if (ptr == NULL) {
      made_so_far++;
      goto done;
    }
    PyList_SET_ITEM(addresses, n_call + made_so_far, ptr);
  }
  if (check_bound())
    goto done;
  CUresult status;
  Py_ssize_t at;
  if (run_plan(steps, addresses, 0, graph, &status, &at) < 0)
    goto done;
  if (status != CUDA_SUCCESS) {
    PyObject *again = PyObject_CallFunction(recover, "inO", (int)status, at, addresses);
    if (again == NULL)
      goto done;
    Py_DECREF(again);
  }
  out = build_result(result, tensors, n_call, storages, addresses);
done:
  while (held > 0) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    held--;
    PyObject *let_go = PyObject_CallNoArgs(PyTuple_GET_ITEM(PyTuple_GET_ITEM(locks, held), 1));
    if (let_go == NULL) {
      Py_CLEAR(out);
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(trace);
    } else {
      Py_DECREF(let_go);
      PyErr_Restore(type, value, trace);
    }
  }
  for (Py_ssize_t i = 0; i < made_so_far; i++)
    Py_DECREF(storages[i]);
  Py_DECREF(addresses);
  if (out == NULL && !PyErr_Occurred())
    PyErr_SetString(PyExc_RuntimeError, "a served call's replay failed with no error set");
  return out;
}

/* 0: `v` added to the signature's parts; 1: the call is for the Python path; -1: error */
static int add_part(PyObject *v, PyObject **parts, Py_ssize_t *n_parts, PyObject **tensors, Py_ssize_t *n_tensors,
                    long *stream_device) {
  if (*n_parts + 2 > MAX_PARTS)
    return 1;
  if ((PyObject *)Py_TYPE(v) == S_tensor_type) {
    if (*n_tensors == MAX_TENSORS)
      return 1;
    PyObject *key = PyObject_GetAttr(v, str_key);
    if (key == Py_None) {
      Py_DECREF(key);
      key = PyObject_CallOneArg(S_tensor_key, v);
    }
    if (key == NULL)
      return -1;
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 6) {
      Py_DECREF(key);
      return 1;
    }
    parts[(*n_parts)++] = key;
    tensors[(*n_tensors)++] = v;
    PyObject *type = PyTuple_GET_ITEM(key, 4);
    if (*stream_device < 0 && PyUnicode_Check(type) && PyUnicode_Compare(type, str_cuda) == 0) {
      *stream_device = PyLong_AsLong(PyTuple_GET_ITEM(key, 5));
      if (*stream_device < 0)
        return PyErr_Occurred() ? -1 : 1;
    }
    return 0;
  }
  int scalar = is_scalar(v);
  if (!scalar && PyTuple_CheckExact(v)) {
    scalar = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v) && scalar; i++)
      scalar = is_scalar(PyTuple_GET_ITEM(v, i));
  }
  if (!scalar)
    return 1;
  Py_INCREF(Py_TYPE(v));
  Py_INCREF(v);
  parts[(*n_parts)++] = (PyObject *)Py_TYPE(v);
  parts[(*n_parts)++] = v;
  return 0;
}

static PyObject *Served_call(Served *self, PyObject *call, PyObject *unused) {
  if (!PyTuple_Check(call) || PyTuple_GET_SIZE(call) != 2) {
    PyErr_SetString(PyExc_TypeError, "a served entry point takes (args, kwargs)");
    return NULL;
  }
  PyObject *args = PyTuple_GET_ITEM(call, 0), *kwargs = PyTuple_GET_ITEM(call, 1);
  if (!served_ready || !PyTuple_Check(args) || !PyDict_Check(kwargs))
    goto slow;
  PyObject *rec = PyObject_GetAttr(S_rec_state, str_rec);
  if (rec == NULL)
    return NULL;
  int recording = rec != Py_None;
  Py_DECREF(rec);
  if (recording || !memory_ready)
    goto slow;
  int held = capturing(); /* a graph capture in progress: the Python path names the op in any refusal */
  if (held)
    return held < 0 ? NULL : PyObject_CallFunctionObjArgs(self->slow, args, kwargs, NULL);
  Py_ssize_t nargs = PyTuple_GET_SIZE(args), nkw = PyDict_GET_SIZE(kwargs);
  if (nkw) {
    PyObject *config = PyDict_GetItemWithError(kwargs, str_config);
    if (config == NULL && PyErr_Occurred())
      return NULL;
    if (config != NULL && config != Py_None)
      goto slow;
  }
  if (self->config_at >= 0 && nargs > self->config_at && PyTuple_GET_ITEM(args, self->config_at) != Py_None)
    goto slow;
  PyObject *parts[MAX_PARTS], *tensors[MAX_TENSORS];
  Py_ssize_t n_parts = 0, n_tensors = 0;
  long stream_device = -1;
  int verdict = 0;
  for (Py_ssize_t i = 0; i < nargs && verdict == 0; i++)
    verdict = add_part(PyTuple_GET_ITEM(args, i), parts, &n_parts, tensors, &n_tensors, &stream_device);
  Py_ssize_t pos = 0;
  PyObject *name, *value;
  while (verdict == 0 && nkw && PyDict_Next(kwargs, &pos, &name, &value))
    verdict = add_part(value, parts, &n_parts, tensors, &n_tensors, &stream_device);
  if (verdict == 0 && nkw) {
    PyObject *keys = PyDict_Keys(kwargs);
    PyObject *names = keys == NULL ? NULL : PyList_AsTuple(keys);
    Py_XDECREF(keys);
    if (names == NULL)
      verdict = -1;
    else
      parts[n_parts++] = names;
  }
  PyObject *stream = NULL; /* borrowed from the signature */
  if (verdict == 0 && stream_device >= 0) {
    stream = current_stream(stream_device);
    if (stream == NULL)
      verdict = -1;
    else
      parts[n_parts++] = stream;
  }
  for (Py_ssize_t i = 0; i < n_tensors && verdict == 0; i++)
    for (Py_ssize_t j = i + 1; j < n_tensors; j++)
      if (tensors[i] == tensors[j])
        verdict = 1; /* one tensor in two places: the Python path decides */
  if (verdict != 0) {
    for (Py_ssize_t i = 0; i < n_parts; i++)
      Py_DECREF(parts[i]);
    if (verdict < 0)
      return NULL;
    goto slow;
  }
  PyObject *signature = PyTuple_New(n_parts);
  if (signature == NULL) {
    for (Py_ssize_t i = 0; i < n_parts; i++)
      Py_DECREF(parts[i]);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n_parts; i++)
    PyTuple_SET_ITEM(signature, i, parts[i]);
  PyObject *plan = PyDict_GetItemWithError(self->memo, signature);
  if (plan == NULL || PyLong_Check(plan)) {
    Py_DECREF(signature);
    if (PyErr_Occurred())
      return NULL;
    goto slow;
  }
  Py_INCREF(plan);
  PyObject *fast = PyObject_GetAttr(plan, str_fast);
  Py_DECREF(plan);
  if (fast == NULL || fast == Py_None) {
    Py_DECREF(signature);
    if (fast == NULL)
      return NULL;
    Py_DECREF(fast);
    goto slow;
  }
  PyObject *out = replay(fast, tensors, n_tensors, stream);
  Py_DECREF(fast);
  Py_DECREF(signature);
  if (out != NULL || PyErr_Occurred())
    return out;
slow:
  return PyObject_CallFunctionObjArgs(self->slow, args, kwargs, NULL);
}

static PyObject *Served_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  PyObject *slow, *memo;
  Py_ssize_t config_at;
  if (!PyArg_ParseTuple(args, "OO!n", &slow, &PyDict_Type, &memo, &config_at))
    return NULL;
  Served *self = (Served *)type->tp_alloc(type, 0);
  if (self == NULL)
    return NULL;
  Py_INCREF(slow);
  Py_INCREF(memo);
  self->config_at = config_at;
  self->slow = slow;
  self->memo = memo;
  return (PyObject *)self;
}

static int Served_traverse(Served *self, visitproc visit, void *arg) {
  Py_VISIT(self->slow);
  Py_VISIT(self->memo);
  return 0;
}

static int Served_clear(Served *self) {
  Py_CLEAR(self->slow);
  Py_CLEAR(self->memo);
  return 0;
}

static void Served_dealloc(Served *self) {
  PyObject_GC_UnTrack(self);
  Served_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ServedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_nbxcert_launcher.Served",
    .tp_basicsize = sizeof(Served),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Served(slow, memo, config_at): a served entry point's replay in C; called with (args, kwargs)",
    .tp_new = Served_new,
    .tp_call = (ternaryfunc)Served_call,
    .tp_traverse = (traverseproc)Served_traverse,
    .tp_clear = (inquiry)Served_clear,
    .tp_dealloc = (destructor)Served_dealloc,
};

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(cuLaunchKernelEx address, tensor map type or None)"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, gx, gy, gz, threads, num_ctas, shared, stream, flags, codes, values) -> CUresult"},
    {"launch_plan", (PyCFunction)(void (*)(void))launch_plan, METH_FASTCALL,
     "launch_plan(steps, addresses, start[, graph]) -> (CUresult, step index)"},
    {"bind_graphs", bind_graphs, METH_VARARGS,
     "bind_graphs(cuGraphCreate, cuGraphAddKernelNode_v2, cuGraphInstantiateWithFlags, cuGraphLaunch, "
     "cuGraphExecKernelNodeSetParams_v2, cuStreamIsCapturing, cuGraphExecDestroy, cuGraphDestroy addresses)"},
    {"setup", setup, METH_VARARGS, "setup(the objects a served call's replay reads: see launch.py)"},
    {"setup_memory", setup_memory, METH_VARARGS, "setup_memory(the objects a replay's memory reads: see memory.py)"},
    {"drain", drain, METH_VARARGS, "drain(device or -1) -> [(ptr, device, stream, size, keep), ...] kept here"},
    {"count", count, METH_VARARGS, "count(device, size, taken): one block taken or freed, counted"},
    {"figures", figures, METH_VARARGS, "figures(device) -> (allocated, peak, count, allocations, frees)"},
    {"set_figures", set_figures, METH_VARARGS, "set_figures(device, allocated, peak, count, allocations, frees)"},
    {"reset_peak", reset_peak, METH_VARARGS, "reset_peak(device): the peak starts afresh from what is held"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nbxcert_launcher", NULL, -1, methods};

PyMODINIT_FUNC PyInit__nbxcert_launcher(void) {
  if (PyType_Ready(&ServedType) < 0 || PyType_Ready(&BlockType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL)
    return NULL;
  Py_INCREF(&ServedType);
  if (PyModule_AddObject(m, "Served", (PyObject *)&ServedType) < 0) {
    Py_DECREF(&ServedType);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&BlockType);
  if (PyModule_AddObject(m, "Block", (PyObject *)&BlockType) < 0) {
    Py_DECREF(&BlockType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
