// The driver's host cost of queuing 1, 2 and 4 kernels: each launched (cuLaunchKernel, cuLaunchKernelEx) against one CUDA
// graph of them (launch only; with every node's parameters set first; with one node's; after an argument block copied
// to the device). Why a plan of several launches is queued as one graph (launcher.c, run_graph). Built and run by
// benchmarks/gpu_launch_cost.sh OUTDIR.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s; cuGetErrorString(r_, &s); fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s); exit(1);} } while (0)
static const char *PTX =
".version 8.0\n.target sm_90\n.address_size 64\n"
".visible .entry k(.param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u32 n0, .param .u32 n1, .param .u32 n2)\n"
"{\n .reg .b64 %rd<3>;\n .reg .b32 %r<4>;\n .reg .pred %p<2>;\n mov.u32 %r2, %tid.x;\n setp.ne.s32 %p1, %r2, 0;\n @%p1 bra DONE;\n"
" ld.param.u64 %rd1, [p0];\n cvta.to.global.u64 %rd2, %rd1;\n ld.param.u32 %r1, [n0];\n st.global.u32 [%rd2], %r1;\nDONE:\n ret;\n}\n";
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static CUfunction fn; static CUstream st; static CUdeviceptr buf;
static unsigned long long p[3]; static unsigned n[3];
static void *params[6];
static void launch1(void) {
  CK(cuLaunchKernel(fn, 64, 1, 1, 128, 1, 1, 0, st, params, NULL));
}
static void launchex1(void) {
  CUlaunchConfig c; memset(&c, 0, sizeof c);
  c.gridDimX = 64; c.gridDimY = 1; c.gridDimZ = 1; c.blockDimX = 128; c.blockDimY = 1; c.blockDimZ = 1; c.hStream = st;
  CK(cuLaunchKernelEx(&c, fn, params, NULL));
}
int main(int argc, char **argv) {
  int iters = 2000;
  CUdevice dev; CUcontext ctx; CUmodule mod;
  CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CK(cuModuleLoadData(&mod, PTX)); CK(cuModuleGetFunction(&fn, mod, "k"));
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)); CK(cuMemAlloc(&buf, 1 << 20));
  p[0] = buf; p[1] = buf + 256; p[2] = buf + 512; n[0] = 1; n[1] = 2; n[2] = 3;
  for (int i = 0; i < 3; i++) { params[i] = &p[i]; params[3 + i] = &n[i]; }
  int widths[3] = {1, 2, 4};
  for (int rep = 0; rep < 3; rep++) {
    for (int w = 0; w < 3; w++) {
      int nk = widths[w];
      double t0, t;
      // direct launches
      CK(cuStreamSynchronize(st)); t0 = now();
      for (int i = 0; i < iters; i++) for (int j = 0; j < nk; j++) { p[0] = buf + 4 * (i & 63); launch1(); }
      t = now() - t0; CK(cuStreamSynchronize(st));
      printf("rep %d kernels %d direct cuLaunchKernel      %.2f us/call\n", rep, nk, t / iters);
      CK(cuStreamSynchronize(st)); t0 = now();
      for (int i = 0; i < iters; i++) for (int j = 0; j < nk; j++) { p[0] = buf + 4 * (i & 63); launchex1(); }
      t = now() - t0; CK(cuStreamSynchronize(st));
      printf("rep %d kernels %d direct cuLaunchKernelEx    %.2f us/call\n", rep, nk, t / iters);
      // a graph of nk chained kernel nodes
      CUgraph g; CUgraphExec ge; CUgraphNode nodes[4];
      CK(cuGraphCreate(&g, 0));
      CUDA_KERNEL_NODE_PARAMS kp; memset(&kp, 0, sizeof kp);
      kp.func = fn; kp.gridDimX = 64; kp.gridDimY = 1; kp.gridDimZ = 1; kp.blockDimX = 128; kp.blockDimY = 1; kp.blockDimZ = 1;
      kp.kernelParams = params;
      for (int j = 0; j < nk; j++) CK(cuGraphAddKernelNode(&nodes[j], g, j ? &nodes[j - 1] : NULL, j ? 1 : 0, &kp));
      CK(cuGraphInstantiate(&ge, g, 0));
      CK(cuGraphLaunch(ge, st)); CK(cuStreamSynchronize(st));
      t0 = now();
      for (int i = 0; i < iters; i++) CK(cuGraphLaunch(ge, st));
      t = now() - t0; CK(cuStreamSynchronize(st));
      printf("rep %d kernels %d graph launch only          %.2f us/call\n", rep, nk, t / iters);
      t0 = now();
      for (int i = 0; i < iters; i++) {
        for (int j = 0; j < nk; j++) { p[0] = buf + 4 * (i & 63); CK(cuGraphExecKernelNodeSetParams(ge, nodes[j], &kp)); }
        CK(cuGraphLaunch(ge, st));
      }
      t = now() - t0; CK(cuStreamSynchronize(st));
      printf("rep %d kernels %d graph set params + launch  %.2f us/call\n", rep, nk, t / iters);
      // only the first node's params change (typical: only the pointers of the call change)
      t0 = now();
      for (int i = 0; i < iters; i++) {
        p[0] = buf + 4 * (i & 63); CK(cuGraphExecKernelNodeSetParams(ge, nodes[0], &kp));
        CK(cuGraphLaunch(ge, st));
      }
      t = now() - t0; CK(cuStreamSynchronize(st));
      printf("rep %d kernels %d graph 1 set + launch       %.2f us/call\n", rep, nk, t / iters);
      // device-side argument block: one async copy from pinned memory, then the graph
      void *pinned; CK(cuMemHostAlloc(&pinned, 4096, 0));
      t0 = now();
      for (int i = 0; i < iters; i++) {
        ((unsigned long long *)pinned)[i & 7] = i;
        CK(cuMemcpyHtoDAsync(buf + 4096, pinned, 128, st));
        CK(cuGraphLaunch(ge, st));
      }
      t = now() - t0; CK(cuStreamSynchronize(st));
      printf("rep %d kernels %d memcpyHtoDAsync + graph    %.2f us/call\n", rep, nk, t / iters);
      CK(cuMemFreeHost(pinned));
      CK(cuGraphExecDestroy(ge)); CK(cuGraphDestroy(g));
    }
  }
  // the device's time of one trivial launch (how far the queue can fall behind)
  CUevent e0, e1; CK(cuEventCreate(&e0, 0)); CK(cuEventCreate(&e1, 0));
  CK(cuEventRecord(e0, st)); for (int i = 0; i < iters; i++) launch1(); CK(cuEventRecord(e1, st)); CK(cuEventSynchronize(e1));
  float ms; CK(cuEventElapsedTime(&ms, e0, e1)); printf("device time per trivial launch %.2f us\n", ms * 1000 / iters);
  return 0;
}
