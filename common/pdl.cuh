// pdl.cuh: programmatic dependent launch (PDL) for the kernels of this repository.
//
// Source of truth: common/pdl.cuh. Each kernel folder builds alone, so scripts/sync_common.py
// copies this file into <kernel>/kernel_src/ and tests/test_common_sync.py fails when a copy
// drifts. Edit it here, then run `python scripts/sync_common.py`.
//
// With PDL (sm_90+) a launch may start while its predecessor in the stream is still running: its
// blocks become resident and wait in griddepcontrol.wait, so a short, decode-sized kernel hides
// its launch latency behind the predecessor's tail. That needs a predecessor that releases its
// dependents, as every kernel here does; after one that does not (a cuBLAS GEMM, a PyTorch
// kernel) a PDL launch was measured slower than a plain one (activation/benchmarks/NOTES.md,
// "Programmatic dependent launch"). So each launch says whether it uses PDL by default (ByDefault):
// the kernels that follow another kernel of the same op do, an op's first kernel only where that
// was measured to pay. The caller's Request (pdl_request.h: the ops' enable_pdl, carried by the
// params) overrides that: kOn turns PDL on for every launch (for callers whose preceding kernel
// releases its dependents), kOff off. Nothing here reads the environment. Everything with code
// has internal linkage, so the copies in different kernel libraries never clash.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "pdl_request.h"

namespace pdl {
namespace {

// Device side. Both are no-ops for a grid launched without PDL and are not compiled for targets
// older than sm_90. The wait must come before the kernel's first global memory access: the grid
// must see all of its predecessor's writes and must not overwrite what the predecessor may still
// read. Releasing the dependents right after only lets the next PDL grid become resident; that
// grid still waits for this one to complete before its own first access.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void release_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
__device__ __forceinline__ void wait_and_release() {
  wait_for_prerequisite_grid();
  release_dependent_grid();
}

// wait_and_release for a kernel whose parameters are `const __grid_constant__` objects: first
// reads one 8-byte word per 64 bytes of each (and the value `ready`), then waits. A launch's
// parameters live in constant bank 0, and every launch's copy misses the SM's constant caches;
// reading them while the grid still waits for its predecessor takes those misses off the
// critical path (H100, attention decode at batch 1: 0.3-0.4 us of an 8-9 us call). `ready` is
// for index math on the parameters that should be done by then too: the wait is predicated on a
// value computed from all of them (both ways, so it always runs), which keeps ptxas from
// scheduling their loads after it. Only kernel parameters may feed `ready`, never global memory.
template <typename... Params>
__device__ __forceinline__ void wait_and_release_after_params(uint64_t ready,
                                                              const Params&... params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto fold = [&](const auto& object) {
    constexpr int kWords = static_cast<int>(sizeof(object) / 8);
    const uint64_t* words = reinterpret_cast<const uint64_t*>(&object);
#pragma unroll
    for (int i = 0; i < kWords; i += 8) ready ^= words[i];
    if constexpr (kWords % 8 != 1 && kWords > 1) ready ^= words[kWords - 1];
  };
  (fold(params), ...);
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.u64 p, %0, 0;\n\t@p griddepcontrol.wait;\n\t"
      "@!p griddepcontrol.wait;\n\t}" ::"l"(ready)
      : "memory");
  release_dependent_grid();
#else
  (void)ready;
  ((void)params, ...);
#endif
}

// Host side. Whether a launch uses PDL under Request::kDefault.
enum class ByDefault { kPlain, kPdl };

// Whether a launch uses PDL: on devices of compute capability 9.0 and up, for the launches that
// ask for it by default (Request::kDefault) or for every launch (kOn); never with kOff. The
// capability is cached per device (no device query per call once known: graph-capture safe).
inline bool enabled(Request request, ByDefault by_default) {
  if (request == Request::kOff || (request != Request::kOn && by_default == ByDefault::kPlain)) {
    return false;
  }
  constexpr int kMaxDevices = 64;
  static std::atomic<int> major_of[kMaxDevices] = {};  // 0: not queried yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  int major = major_of[device].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      return false;
    }
    major_of[device].store(major, std::memory_order_relaxed);
  }
  return major >= 9;
}

// Clusters of `x` CTAs along grid x (thread block clusters, sm_90+); 1: no cluster attribute.
struct Cluster {
  unsigned x = 1;
};

// Launches kernel<<<grid, block, smem, stream>>>(args...) in clusters of `cluster` CTAs, with PDL
// when enabled(request, by_default), and returns the launch error, if any.
template <typename... Params, typename... Args>
cudaError_t launch(Request request, ByDefault by_default, Cluster cluster,
                   void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (enabled(request, by_default)) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = n > 0 ? attrs : nullptr;
  config.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// The same without clusters.
template <typename... Params, typename... Args>
cudaError_t launch(Request request, ByDefault by_default, void (*kernel)(Params...), dim3 grid,
                   dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  return launch(request, by_default, Cluster{}, kernel, grid, block, smem, stream,
                std::forward<Args>(args)...);
}

}  // namespace
}  // namespace pdl
