// attention_cuda_mma.cuh: the warp-level building blocks of the attention kernels (CUDA runtime and
// cuda_fp16/cuda_bf16 only, no Torch headers): mma.sync m16n8k16 with fp32 accumulation,
// ldmatrix (plain and transposed), cp.async with zero fill, shuffles and a warp vote, ex2 / lg2 /
// tanh approximations, cluster barriers and shared-memory loads across a cluster (sm_90+),
// fp32 -> fp16/bf16 pair packing, the swizzled shared-memory tile layout and
// a division by an invariant 32-bit divisor.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16/.bf16 inputs), with
// lane = 4 g + t (g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major):  a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..)  a[2] = (g, 2t+8..)
//                            a[3] = (g+8, 2t+8..), two 16-bit elements per 32-bit register
//   B (16 x 8, "col"):       b[0] = (k 2t..2t+1, n g)  b[1] = (k 2t+8.., n g)
//   C/D (16 x 8, fp32):      c[0..1] = (g, 2t..2t+1)  c[2..3] = (g+8, 2t..2t+1)
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit elements; lanes 8i .. 8i+7 give the row
// addresses of matrix i, and register i of lane 4g + t receives elements (g, 2t..2t+1) of
// matrix i (.trans: elements (2t..2t+1, g), i.e. of the transposed matrix). So one ldmatrix.x4
// gives a whole A fragment, or the B fragments of two n-tiles (K rows for S = Q K^T; V rows with
// .trans for O = P V); the C fragments of two adjacent n-tiles of S are, once packed to 16 bits,
// the A fragment of P for the next product (no shared-memory round trip).
//
// The inline assembly is compiled for the device only: nvcc's host pass parses these __device__
// functions (their #else branches) but never emits them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace attention {
namespace cuda {
namespace detail {

// ---------------------------------------------------------------------------------------------
// Division of n in [0, 2^31) by an invariant d in [1, 2^31]: q = (n * mul) >> shift with
// mul = ceil(2^shift / d) < 2^32, shift = 31 + ceil(log2 d). Exact: mul * d - 2^shift < d, so
// the error term n (mul d - 2^shift) / (d 2^shift) stays below 1 / d (Granlund & Montgomery).
// One 32 x 32 -> 64-bit multiply and a shift.
// ---------------------------------------------------------------------------------------------
struct FastDivU32 {
  uint32_t mul;
  uint32_t shift;

  static FastDivU32 make(uint32_t d) {
    uint32_t l = 0;
    while (l < 31 && (uint64_t(1) << l) < d) ++l;
    const uint32_t s = 31 + l;
    const uint64_t m = ((uint64_t(1) << s) + d - 1) / d;
    return FastDivU32{static_cast<uint32_t>(m), s};
  }
  __host__ __device__ __forceinline__ int div(int n) const {
    return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * mul) >> shift);
  }
};

// ---------------------------------------------------------------------------------------------
// Shared memory. Tiles are [rows][D] 16-bit elements, rows of D * 2 bytes, stored in 16-byte
// chunks whose index is XOR-swizzled with the row, so that the 8 row addresses of every
// ldmatrix phase (8 rows, one chunk each) and every 16-byte cp.async / 4-byte staging store of
// 8 rows hit 8 distinct 16-byte bank groups:
//   D % 64 == 0 (rows of 128 B multiples):  chunk ^ (row % 8)
//   D % 64 == 32 (rows of 64 B + k 128 B):  chunk ^ ((row / 2) % 4)   (rows 2r and 2r+1 share a
//                                           128-byte line; the XOR spreads the 4 row pairs)
// Both only flip bits inside groups of 8 (4) chunks, so a swizzled chunk stays in its row. Rows
// accessed by one ldmatrix always start at a multiple of 8, so the XOR term depends on the lane
// only.
// ---------------------------------------------------------------------------------------------
template <int kHeadDim>
__host__ __device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  static_assert(kHeadDim % 32 == 0, "head_dim a multiple of 32");
  constexpr int kRowBytes = kHeadDim * 2;
  if constexpr (kHeadDim % 64 == 0) {
    return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
  } else {
    return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ ((row >> 1) & 3)) << 4));
  }
}

// ldmatrix row addresses with one register per operand. A warp's ldmatrix.x4 reads rows
// row_base + lr (row_base a multiple of 8, lr the lane's row in a 16-row group) at chunk
// 2 ks + lc (lc = 0 or 1) of k-step ks. The swizzle flips only the low kSwizzle bits of the chunk
// index (kSwizzle = 8 or 4 chunks, i.e. kVariants = 4 or 2 k-steps per group), and a tile base
// plus row_base * row_bytes has those address bits clear (tiles are 128-byte aligned, rows a
// multiple of 8 of 64-byte multiples), so
//   tile + tile_offset(row_base + lr, 2 ks + lc)
//     = ((tile + base) ^ (ks % kVariants) * 32) + row_base * row_bytes
//       + (ks / kVariants) * kSwizzle * 16,         base = tile_offset(lr, lc)
// one LOP3 with an immediate per access and the rest an immediate of the ldmatrix. (Per-k-step
// offsets are loop invariants that the compiler would keep in registers: 4 per operand.)
template <int kHeadDim>
struct SwizzledRows {
  static constexpr int kSwizzle = kHeadDim % 64 == 0 ? 8 : 4;
  static constexpr int kVariants = kSwizzle / 2;
  uint32_t base;

  __host__ __device__ __forceinline__ SwizzledRows(int lr, int lc, uint32_t row_base_bytes)
      : base(row_base_bytes + tile_offset<kHeadDim>(lr, lc)) {}
  // Address of (rows + lr, k-step ks) in the tile whose lane address is tile + base (rows a
  // multiple of 8).
  __host__ __device__ __forceinline__ static uint32_t at(uint32_t lane_addr, int rows, int ks) {
    return (lane_addr ^ static_cast<uint32_t>((ks % kVariants) * 32)) +
           static_cast<uint32_t>(rows * kHeadDim * 2 + (ks / kVariants) * kSwizzle * 16);
  }
};

// The CTA's dynamic shared memory and the 32-bit shared-window address of a pointer into it.
__device__ __forceinline__ uint8_t* dynamic_smem() {
#if defined(__CUDA_ARCH__)
  extern __shared__ __align__(128) uint8_t attention_smem[];
  return attention_smem;
#else
  return nullptr;
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#else
  (void)p;
  return 0;
#endif
}

// ---------------------------------------------------------------------------------------------
// cp.async: 16 bytes global -> shared, bypassing L1 (.cg); src_bytes = 0 writes 16 zero bytes
// without reading (rows past the end of a sequence, so that masked keys and values are finite
// and nothing outside the tensors is read). The pointer must still be a valid generic address.
// Groups: commit closes the copies issued so far by this thread; wait<N> returns when at most
// N of this thread's groups are pending (other threads' copies need a barrier after it).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
#else
  (void)dst, (void)src, (void)src_bytes;
#endif
}

// 4 bytes global -> shared through L1 (.ca: the only class that takes 4 bytes); same zero fill.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
#else
  (void)dst, (void)src, (void)src_bytes;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ---------------------------------------------------------------------------------------------
// ldmatrix.x4 (volatile: ordered after the cp.async wait and barrier that publish the tile).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  (void)addr;
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  (void)addr;
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

// 4 bytes into shared memory, ordered with the ldmatrix reads of other warps by a barrier.
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
#else
  (void)addr, (void)v;
#endif
}

// ---------------------------------------------------------------------------------------------
// d += a * b on one m16n8k16 tile, fp32 accumulation; T = __half or __nv_bfloat16.
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same<T, __half>::value, "__half or __nv_bfloat16");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  (void)d, (void)a, (void)b0, (void)b1;
#endif
}

// Butterfly exchange (quad reductions of C-fragment rows: masks 1 and 2; warp sums: 1 .. 16).
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
#if defined(__CUDA_ARCH__)
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#else
  (void)lane_mask;
  return v;
#endif
}

// Lane `src`'s value (decode tiles: the page block id that lane src loaded).
__device__ __forceinline__ int32_t shfl_idx(int32_t v, int src) {
#if defined(__CUDA_ARCH__)
  return __shfl_sync(0xffffffffu, v, src);
#else
  (void)src;
  return v;
#endif
}

// True on every lane when `pred` holds on any lane of the warp.
__device__ __forceinline__ bool warp_any(bool pred) {
#if defined(__CUDA_ARCH__)
  return __any_sync(0xffffffffu, pred) != 0;
#else
  return pred;
#endif
}

// ---------------------------------------------------------------------------------------------
// Thread-block clusters (sm_90+): the CTAs of a cluster read each other's shared memory (DSMEM)
// between cluster barriers. cluster_sync: every thread of every CTA of the cluster arrives
// (release) and waits (acquire), so shared-memory writes before it are visible to the cluster
// after it. A CTA must not exit while another may still read its shared memory, hence a
// closing cluster_sync after the last remote read. Compiled for sm_90+ only; the launcher never
// starts a cluster elsewhere.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __syncwarp();  // .aligned: the whole warp executes the barrier together
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
#endif
}

// The shared::cluster address of shared-window address `addr` in the CTA of cluster rank `rank`.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t mapped = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(mapped) : "r"(addr), "r"(rank));
#else
  (void)addr, (void)rank;
#endif
  return mapped;
}

__device__ __forceinline__ float cluster_load_f32(uint32_t addr) {
  float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
#else
  (void)addr;
#endif
  return v;
}

__device__ __forceinline__ float4 cluster_load_f32x4(uint32_t addr) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#else
  (void)addr;
#endif
  return v;
}

// ---------------------------------------------------------------------------------------------
// Math. ex2.approx.ftz: 2 ulp, ex2(-inf) = +0 (masked scores vanish without a test).
// tanh.approx.f32 (sm_75+): max relative error about 2^-11, the softcap's nonlinearity (as in
// flash-attn, whose softcap uses the same instruction).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

__device__ __forceinline__ float fast_log2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::log2(x);
#endif
}

__device__ __forceinline__ float fast_tanh(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::tanh(x);
#endif
}

// Two fp32 values rounded to nearest even and packed: lo in bits 0..15 (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return static_cast<uint32_t>(__bfloat16_as_ushort(__low2bfloat16(p))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__high2bfloat16(p))) << 16);
  } else {
    const __half2 p = __floats2half2_rn(lo, hi);
    return static_cast<uint32_t>(__half_as_ushort(__low2half(p))) |
           (static_cast<uint32_t>(__half_as_ushort(__high2half(p))) << 16);
  }
}

// Reinterpretations of 16-byte chunks (global and shared accesses of whole chunks).
struct alignas(16) Chunk16 {
  uint32_t w[4];
};

}  // namespace detail
}  // namespace cuda
}  // namespace attention
