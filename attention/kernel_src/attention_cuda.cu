// attention_cuda.cu: host launcher of the CUDA attention forward (attention_cuda.h).
//
// What it computes (attention_params.h, flash-attn 2 semantics): for every sequence b, query
// head h and query row i, out_i = softmax_j(s_ij) v_j over the visible keys j, with
// s_ij = scale <q_i, k_j> (then softcap * tanh(s / softcap), then - slope |d_i - j| for ALiBi),
// visibility bottom-right aligned (d_i = i + len_k - len_q; causal: j <= d_i; window:
// d_i - left <= j <= d_i + right; j < len_k), and lse_i = log sum_j exp(s_ij). A row without a
// visible key gets out = 0 and lse = +inf; NaN propagates (attention_params.h). q/k/v/out fp16
// or bf16 (one dtype), fp32 softmax and accumulation, out rounded once; head_dim a multiple of 8 up
// to 256 (instances for 32, 64, 96, 128, 192, 256; a head dim between them runs the next larger
// instance: instance_head_dim). GQA/MQA map query head h to kv head h / (heads_q / heads_kv).
// Layout: [batch, seqlen, heads, head_dim] views with unit stride along head_dim and any batch /
// row / head strides that keep 16-byte chunks (multiples of 8 elements, 16-byte aligned bases;
// attention_cuda.h); varlen q/k packed along the rows and delimited by cu_seqlens; K/V rows
// through kv_batch_idx and leftpad_k (keys at rows [pad, pad + len_k), len_k = seqused_k[b] or
// seqlen_k - pad, as attention_cpu.cpp), or through a block table (paged: any page size >= 1).
//
// Limits: head_dim a multiple of 8 in [8, 256]; heads_q a multiple of heads_kv and at most 65535;
// batch, seqlen_q and seqlen_k below 2^31; 16-byte aligned q/k/v/out bases and strides in
// multiples of 8 elements; num_splits at most 128 (attention_cuda.h lists the preconditions the
// caller checks).
//
// This file is the host side: device properties, the choice between the Hopper path and stage 1,
// and for stage 1 the kernel choice (plan_tiles), split-KV and cluster-merge decisions
// (plan_splits, plan_cluster), the tile order (plan_tile_group), argument resolution (make_args)
// and the launches. It includes no kernel body: the kernels are in attention_fwd_kernel.cuh
// (design notes there) and attention_fwd_combine_kernel.cuh, their instances in the generated
// attention_fwd_*.cu files (generate_instances.py), reached through the dispatch functions of
// attention_fwd_instances.h. On capability 9.0 the params that attention_sm90.h's rule admits run
// the Hopper kernel instead (attention_sm90.cu, built for 9.0a only), unless
// params.allow_hopper is false. Measurements behind the policies: attention/benchmarks/NOTES.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attention_cuda.h"
#include "attention_device_info.h"
#include "attention_fwd_args.h"
#include "attention_fwd_config.h"
#include "attention_fwd_instances.h"
#include "attention_params.h"
#include "attention_sm90.h"
#include "pdl.cuh"

namespace attention {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Host side: device properties, kernel table, plan, validation, launch.
// ---------------------------------------------------------------------------------------------
constexpr int kMaxDevices = 64;

}  // namespace

cudaError_t device_info(DeviceInfo* info) {
  static std::atomic<int> sms_of[kMaxDevices] = {};
  static std::atomic<int> smem_optin_of[kMaxDevices] = {};
  static std::atomic<int> l2_bytes_of[kMaxDevices] = {};
  static std::atomic<int> cc_major_of[kMaxDevices] = {};
  static std::atomic<int> smem_per_sm_of[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  int sms = sms_of[device].load(std::memory_order_relaxed);
  int smem_optin = smem_optin_of[device].load(std::memory_order_relaxed);
  int l2_bytes = l2_bytes_of[device].load(std::memory_order_relaxed);
  int cc_major = cc_major_of[device].load(std::memory_order_relaxed);
  int smem_per_sm = smem_per_sm_of[device].load(std::memory_order_relaxed);
  if (sms == 0 || smem_optin == 0 || l2_bytes == 0 || cc_major == 0 || smem_per_sm == 0) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    if (err != cudaSuccess) return err;
    if (sms <= 0 || smem_optin <= 0 || l2_bytes <= 0 || cc_major <= 0 || smem_per_sm <= 0) {
      return cudaErrorInvalidDevice;
    }
    sms_of[device].store(sms, std::memory_order_relaxed);
    smem_optin_of[device].store(smem_optin, std::memory_order_relaxed);
    l2_bytes_of[device].store(l2_bytes, std::memory_order_relaxed);
    cc_major_of[device].store(cc_major, std::memory_order_relaxed);
    smem_per_sm_of[device].store(smem_per_sm, std::memory_order_relaxed);
  }
  info->sms = sms;
  info->smem_optin = smem_optin;
  info->l2_bytes = l2_bytes;
  info->cc_major = cc_major;
  info->smem_per_sm = smem_per_sm;
  return cudaSuccess;
}

namespace {

struct KernelInfo {
  FwdKernelFn fn;
  int threads, smem, block_m, block_n;
  cudaError_t (*prepare)(int* ctas_per_sm);  // opt-in smem once per device; occupancy
  // Clusters of `size` CTAs of `smem` bytes each that can be resident at once (0: none).
  cudaError_t (*max_clusters)(int size, int smem, int* count);
};

// Opts the instance into its shared memory once per device and returns its resident CTAs per
// SM (cached: both are per-device properties).
template <typename T, class Cfg, bool kScoreMod>
cudaError_t prepare_kernel(int* ctas_per_sm) {
  static std::atomic<int> occupancy_of[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  int occ = occupancy_of[device].load(std::memory_order_relaxed);
  if (occ == 0) {
    const FwdKernelFn fn = fwd_kernel<T, Cfg, kScoreMod>();
    err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, Cfg::kThreads, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    if (occ <= 0) return cudaErrorInvalidConfiguration;
    occupancy_of[device].store(occ, std::memory_order_relaxed);
  }
  *ctas_per_sm = occ;
  return cudaSuccess;
}

// Resident clusters of `size` CTAs of the instance with `smem` bytes of dynamic shared memory each
// (cached per device and size: a caller passes the same smem for both; sm_90+ only, where the
// instance is also opted into that much shared memory).
template <typename T, class Cfg, bool kScoreMod>
cudaError_t max_clusters(int size, int smem, int* count) {
  static std::atomic<int> count_of[kMaxDevices][kClusterMergeMaxSplits + 1] =
      {};  // count + 1; 0: unknown
  *count = 0;
  if (size < 1 || size > kClusterMergeMaxSplits) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  int cached = count_of[device][size].load(std::memory_order_relaxed);
  if (cached == 0) {
    int occ = 0;
    err = prepare_kernel<T, Cfg, kScoreMod>(&occ);  // the shared-memory opt-in
    if (err != cudaSuccess) return err;
    const FwdKernelFn fn = fwd_kernel<T, Cfg, kScoreMod>();
    if (smem > Cfg::kSmemBytes)
      err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(size);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int n = 0;
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&n, fn, &config);
    if (err != cudaSuccess) {  // a device or size without such clusters: none, not a failure
      (void)cudaGetLastError();
      n = 0;
    }
    cached = n + 1;
    count_of[device][size].store(cached, std::memory_order_relaxed);
  }
  *count = cached - 1;
  return cudaSuccess;
}

template <typename T, class Cfg, bool kScoreMod>
KernelInfo kernel_info() {
  return KernelInfo{fwd_kernel<T, Cfg, kScoreMod>(),
                    Cfg::kThreads,
                    Cfg::kSmemBytes,
                    Cfg::kBlockM,
                    Cfg::kBlockN,
                    prepare_kernel<T, Cfg, kScoreMod>,
                    max_clusters<T, Cfg, kScoreMod>};
}

// The instance that runs a head dim: the smallest instantiated one that holds it (with Q's columns
// past the head dim zero-filled and no store past it; attention_fwd_kernel.cuh), or 0 for a head
// dim that is not a multiple of 8 in [8, 256] (the kernels move 16-byte chunks of whole columns).
int64_t instance_head_dim(int64_t head_dim) {
  if (head_dim < 8 || head_dim > 256 || head_dim % 8 != 0) return 0;
  for (const int64_t d : {32, 64, 96, 128, 192, 256}) {
    if (head_dim <= d) return d;
  }
  return 0;
}

// Head dim 128 takes the 64-key tile where two of its CTAs fit in an SM's shared memory, head dim
// 192 its 128-row tile where one CTA fits.
bool prefill128_wide(const DeviceInfo& dev) {
  return 2 * Prefill128Wide::kSmemBytes <= dev.smem_optin;
}
bool prefill192_wide(const DeviceInfo& dev) { return Prefill192Wide::kSmemBytes <= dev.smem_optin; }

template <typename T, bool kScoreMod>
bool prefill_kernel(int64_t head_dim, const DeviceInfo& dev, KernelInfo* k) {
  switch (instance_head_dim(head_dim)) {
    case 32:
      *k = kernel_info<T, Prefill32, kScoreMod>();
      return true;
    case 64:
      *k = kernel_info<T, Prefill64, kScoreMod>();
      return true;
    case 96:
      *k = kernel_info<T, Prefill96, kScoreMod>();
      return true;
    case 128:
      *k = prefill128_wide(dev) ? kernel_info<T, Prefill128Wide, kScoreMod>()
                                : kernel_info<T, Prefill128, kScoreMod>();
      return true;
    case 192:
      *k = prefill192_wide(dev) ? kernel_info<T, Prefill192Wide, kScoreMod>()
                                : kernel_info<T, Prefill192, kScoreMod>();
      return true;
    case 256:
      *k = kernel_info<T, Prefill256, kScoreMod>();
      return true;
    default:
      return false;
  }
}

// Decode tiles have a fast build too although at 16 rows the per-score work is hidden by the K/V
// stream: a batch-1 decode call is bound by the latency of its instruction stream, which the
// modifier build lengthens (benchmarks/NOTES.md, "Figures behind the launch policies").
template <typename T, bool kScoreMod>
bool decode_kernel(int64_t head_dim, KernelInfo* k) {
  switch (instance_head_dim(head_dim)) {
    case 32:
      *k = kernel_info<T, Decode32, kScoreMod>();
      return true;
    case 64:
      *k = kernel_info<T, Decode64, kScoreMod>();
      return true;
    case 96:
      *k = kernel_info<T, Decode96, kScoreMod>();
      return true;
    case 128:
      *k = kernel_info<T, Decode128, kScoreMod>();
      return true;
    case 192:
      *k = kernel_info<T, Decode192, kScoreMod>();
      return true;
    case 256:
      *k = kernel_info<T, Decode256, kScoreMod>();
      return true;
    default:
      return false;
  }
}

// The kernel of one dtype and score-modifier build, with decode or prefill tiles.
template <typename T, bool kScoreMod>
bool pick_kernel(bool decode, int64_t head_dim, const DeviceInfo& dev, KernelInfo* k) {
  return decode ? decode_kernel<T, kScoreMod>(head_dim, k)
                : prefill_kernel<T, kScoreMod>(head_dim, dev, k);
}

struct Plan {
  KernelInfo kernel;
  int qpack;       // q heads per kv head packed into the rows (1: none)
  int heads_grid;  // grid y: heads_q / qpack
  int m_blocks;    // query tiles per (sequence, head)
  int num_splits;
  int cluster;  // CTAs per cluster: num_splits when the splits merge in a cluster, else 1
  int smem;     // dynamic shared memory per CTA of the launch (kernel.smem or more)
  bool decode;  // decode tiles (kWarpsN > 1): always in grid order
};

bool aligned_to(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Internal consistency of the params (attention_params.h; attention_cuda.h lists what the
// caller checks). True when there is work to do or nothing at all (*empty).
bool params_ok(const AttnFwdParams& p, bool* empty) {
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  *empty = false;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return false;
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0 || p.heads_kv < 0)
    return false;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) {
    *empty = true;
    return true;
  }
  if (instance_head_dim(p.head_dim) == 0) return false;
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0) return false;
  if (p.heads_q > LaunchConfig::kMaxGridYZ || p.batch > kMax32 || p.seqlen_q > kMax32 ||
      p.seqlen_k > kMax32) {
    return false;
  }
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.out == nullptr) return false;
  // 16-byte chunks of q/k/v/out: aligned bases, strides in whole chunks.
  for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.out)}) {
    if (!aligned_to(ptr, 16)) return false;
  }
  // (A stride along a dimension of extent 1 is never used. Extents not known here count as 2,
  // i.e. the stride is always checked: the rows of packed varlen q/k (total rows, not the
  // per-sequence maximum) and the K/V batches addressed through kv_batch_idx.)
  const bool paged_kv = p.block_table != nullptr;
  const bool varlen_q = p.cu_seqlens_q != nullptr;
  const int64_t q_batches = varlen_q ? 1 : p.batch;
  const int64_t q_rows = varlen_q ? 2 : p.seqlen_q;
  const int64_t kv_rows = paged_kv ? p.page_block_size : p.cu_seqlens_k != nullptr ? 2 : p.seqlen_k;
  const int64_t kv_batches = paged_kv                    ? (p.num_blocks > 0 ? p.num_blocks : 2)
                             : p.cu_seqlens_k != nullptr ? 1
                             : p.kv_batch_idx != nullptr ? 2
                                                         : p.batch;
  const struct {
    int64_t stride, extent;
  } strides[] = {
      {p.q_batch_stride, q_batches},   {p.q_row_stride, q_rows},   {p.q_head_stride, p.heads_q},
      {p.out_batch_stride, q_batches}, {p.out_row_stride, q_rows}, {p.out_head_stride, p.heads_q},
      {p.k_batch_stride, kv_batches},  {p.k_row_stride, kv_rows},  {p.k_head_stride, p.heads_kv},
      {p.v_batch_stride, kv_batches},  {p.v_row_stride, kv_rows},  {p.v_head_stride, p.heads_kv}};
  for (const auto& st : strides) {
    if (st.extent > 1 && st.stride % 8 != 0) return false;
  }
  if (p.lse != nullptr && !aligned_to(p.lse, 4)) return false;
  if (paged_kv) {
    if (p.page_block_size < 1 || p.page_block_size > kMax32 || p.leftpad_k != nullptr ||
        p.kv_batch_idx != nullptr) {
      return false;
    }
  }
  if (p.leftpad_k != nullptr && p.cu_seqlens_k != nullptr) return false;
  if (p.softcap < 0.0f || !(p.softmax_scale == p.softmax_scale)) return false;
  if (p.window_left < -1 || p.window_right < -1) return false;
  if (p.num_splits < 0) return false;
  return true;
}

// Kernel family, packing and tiles for the params (no split decision).
bool plan_tiles(const AttnFwdParams& p, const DeviceInfo& dev, Plan* plan) {
  const int64_t group = p.heads_q / p.heads_kv;
  const bool score_mod = p.softcap > 0.0f || p.alibi_slopes != nullptr;
  const bool bf16 = p.dtype == DType::kBFloat16;
  int64_t qpack = 1;
  bool decode = false;
  if (p.seqlen_q * group <= LaunchConfig::kDecodeMaxRows) {
    qpack = group;  // decode: the q heads of a kv head share its K/V tiles
    decode = true;
  }
  if (!decode && group > 1) {
    KernelInfo probe;
    if (!prefill_kernel<__half, false>(p.head_dim, dev, &probe)) return false;
    if (p.seqlen_q < probe.block_m) qpack = group;  // fill the query tile with the group's heads
  }
  using Pick = bool (*)(bool, int64_t, const DeviceInfo&, KernelInfo*);
  const Pick pick =
      bf16 ? (score_mod ? pick_kernel<__nv_bfloat16, true> : pick_kernel<__nv_bfloat16, false>)
           : (score_mod ? pick_kernel<__half, true> : pick_kernel<__half, false>);
  KernelInfo k;
  const bool ok = pick(decode, p.head_dim, dev, &k);
  if (!ok) return false;
  plan->kernel = k;
  plan->decode = decode;
  plan->qpack = static_cast<int>(qpack);
  plan->heads_grid = static_cast<int>(p.heads_q / qpack);
  const int64_t rows = p.seqlen_q * qpack;
  if (rows > std::numeric_limits<int32_t>::max() - 256) return false;
  plan->m_blocks = static_cast<int>(ceil_div(rows, k.block_m));
  plan->num_splits = 1;
  plan->cluster = 1;
  plan->smem = k.smem;
  return true;
}

// Whether a plan for these params could merge its splits in a cluster at all (plan_cluster adds the
// split count, grid and residency conditions): a contiguous cache on sm_90+, merge allowed by the params.
bool cluster_merge_capable(const AttnFwdParams& p, const DeviceInfo& dev) {
  return p.block_table == nullptr && dev.cc_major >= 9 && p.allow_cluster_merge;
}

// Splits for a plan: params.num_splits when given, else the wave-efficiency heuristic.
cudaError_t plan_splits(const AttnFwdParams& p, const DeviceInfo& dev, Plan* plan) {
  const int64_t n_blocks = ceil_div(p.seqlen_k, plan->kernel.block_n);
  const int64_t cap = min64(LaunchConfig::kMaxSplits, max64(1, n_blocks));
  if (p.num_splits >= 1) {
    plan->num_splits = static_cast<int>(min64(p.num_splits, cap));
    return cudaSuccess;
  }
  int occ = 0;
  cudaError_t err = plan->kernel.prepare(&occ);
  if (err != cudaSuccess) return err;
  const int64_t slots = static_cast<int64_t>(dev.sms) * occ;
  const int64_t ctas = p.batch * plan->heads_grid * plan->m_blocks;
  plan->num_splits = 1;
  if (ctas >= LaunchConfig::kNoSplitWaves * slots) return cudaSuccess;
  const int64_t max_splits = min64(cap, n_blocks / LaunchConfig::kMinTilesPerSplit);
  if (max_splits <= 1) return cudaSuccess;
  // Decode tiles, small grids: one CTA per SM (each warp keeps both of its stages in flight, so one
  // CTA streams more than an SM's share of the DRAM bandwidth and more CTAs only add split
  // overhead): contiguous caches below SMs CTAs, paged ones below SMs / 8. Such a split may be a
  // single key tile once there are 4 tiles or more, except where that would take a contiguous
  // cache past the cluster merge's bound on sm_90+. Measured in benchmarks/NOTES.md ("Split counts
  // and prefill tiles", "Figures behind the launch policies"; python attention/benchmarks/sweep.py).
  const int64_t one_per_sm_below = p.block_table == nullptr ? dev.sms : dev.sms / 8 + 1;
  if (plan->decode && ctas < one_per_sm_below) {
    const int64_t per_sm = dev.sms / ctas;
    const int64_t two_tile_splits = min64(max_splits, per_sm);
    const int64_t one_tile_splits = min64(cap, per_sm);
    const bool keep_cluster = cluster_merge_capable(p, dev) &&
                              two_tile_splits <= kClusterMergeMaxSplits &&
                              one_tile_splits > kClusterMergeMaxSplits;
    plan->num_splits = static_cast<int>(keep_cluster ? two_tile_splits : one_tile_splits);
    return cudaSuccess;
  }
  // Wave efficiency of s splits: CTAs / (waves rounded up x slots). The smallest s within
  // kSplitEfficiency of the best (fewer splits: less combine traffic, longer K/V streams).
  double best = 0.0;
  for (int64_t sp = 1; sp <= max_splits; ++sp) {
    const double waves = static_cast<double>(ctas * sp) / static_cast<double>(slots);
    const double eff = waves / std::ceil(waves);
    if (eff > best) best = eff;
  }
  for (int64_t sp = 1; sp <= max_splits; ++sp) {
    const double waves = static_cast<double>(ctas * sp) / static_cast<double>(slots);
    if (waves / std::ceil(waves) >= LaunchConfig::kSplitEfficiency * best) {
      plan->num_splits = static_cast<int>(sp);
      break;
    }
  }
  return cudaSuccess;
}

// Whether the splits of a plan merge in a cluster (merge_splits_in_cluster) instead of the combine
// kernel: decode tiles on sm_90+ reading a contiguous cache, 2 to kClusterMergeMaxSplits splits, a
// grid of at most one CTA per SM (as plan_splits sizes small decode grids), every cluster resident
// at once, and params.allow_cluster_merge. The launch asks for more than half of an SM's shared memory
// per CTA, so that each CTA has an SM of its own, as the combine path's grid has (without that,
// batch-1 decode in clusters was slower than with the combine kernel). Where clusters pay, and why
// at most 4 splits and no paged cache: benchmarks/NOTES.md, "Figures behind the launch policies".
cudaError_t plan_cluster(const AttnFwdParams& p, const DeviceInfo& dev, Plan* plan) {
  plan->cluster = 1;
  const int64_t clusters = p.batch * plan->heads_grid * plan->m_blocks;
  if (!plan->decode || !cluster_merge_capable(p, dev) || plan->num_splits < 2 ||
      plan->num_splits > kClusterMergeMaxSplits || clusters * plan->num_splits > dev.sms) {
    return cudaSuccess;
  }
  const int smem = std::max(plan->kernel.smem, dev.smem_per_sm / 2 + 1024);
  if (smem > dev.smem_optin) return cudaSuccess;
  int resident = 0;
  const cudaError_t err = plan->kernel.max_clusters(plan->num_splits, smem, &resident);
  if (err != cudaSuccess) return err;
  if (clusters <= resident) {
    plan->cluster = plan->num_splits;
    plan->smem = smem;
  }
  return cudaSuccess;
}

// Tile order (tile_coords): heaviest tiles first over groups of (head, sequence) pairs when the
// query tiles of a pair differ in work (a causal mask or a window) and there is no split; a group
// holds as many pairs as keep their K/V within a fraction of L2 (the pairs of a group run
// together, and each reads its K/V once per query tile).
uint32_t plan_tile_group(const AttnFwdParams& p, const DeviceInfo& dev, const Plan& plan,
                         int64_t grid_x, int64_t grid_z) {
  const bool uneven = p.causal || p.window_left >= 0 || p.window_right >= 0;
  const int64_t pairs = static_cast<int64_t>(plan.heads_grid) * grid_z;
  if (!uneven || plan.decode || plan.num_splits > 1 || plan.m_blocks < 2 || pairs < 2) return 1;
  // The grid heads of one kv head (GQA) share its K/V when they are in the same group.
  return static_cast<uint32_t>(
      tile_group_pairs(pairs, plan.heads_grid / p.heads_kv, p.seqlen_k, p.head_dim, dev.l2_bytes));
}

FwdArgs make_args(const AttnFwdParams& p, const Plan& plan) {
  FwdArgs a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.out = p.out;
  a.q_batch_stride = p.q_batch_stride;
  a.q_row_stride = p.q_row_stride;
  a.q_head_stride = p.q_head_stride;
  a.k_batch_stride = p.k_batch_stride;
  a.k_row_stride = p.k_row_stride;
  a.k_head_stride = p.k_head_stride;
  a.v_batch_stride = p.v_batch_stride;
  a.v_row_stride = p.v_row_stride;
  a.v_head_stride = p.v_head_stride;
  a.out_batch_stride = p.out_batch_stride;
  a.out_row_stride = p.out_row_stride;
  a.out_head_stride = p.out_head_stride;
  a.lse = p.lse;
  a.lse_batch_stride = p.lse_batch_stride;
  a.lse_head_stride = p.lse_head_stride;
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.seqused_k = p.seqused_k;
  a.kv_batch_idx = p.kv_batch_idx;
  a.leftpad_k = p.leftpad_k;
  a.block_table = p.block_table;
  a.block_table_batch_stride = p.block_table_batch_stride;
  a.page_block_size = p.block_table != nullptr ? static_cast<int>(p.page_block_size) : 1;
  a.page_div = FastDivU32::make(static_cast<uint32_t>(a.page_block_size));
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_k = static_cast<int>(p.seqlen_k);
  a.batch = static_cast<int>(p.batch);
  a.batch_base = 0;
  a.heads_q = static_cast<int>(p.heads_q);
  a.group = static_cast<int>(p.heads_q / p.heads_kv);
  a.head_dim = static_cast<int>(p.head_dim);
  a.last_chunk = a.head_dim / 8 - 1;
  a.qpack = plan.qpack;
  a.qpack_div = FastDivU32::make(static_cast<uint32_t>(plan.qpack));
  a.m_blocks = plan.m_blocks;
  a.num_splits = plan.num_splits;
  a.cluster_merge = plan.cluster > 1 ? 1 : 0;
  a.heads_grid_div = FastDivU32::make(static_cast<uint32_t>(plan.heads_grid));
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.softcap_scale = p.softcap > 0.0f ? p.softmax_scale / p.softcap : 0.0f;
  a.softcap_log2 = p.softcap > 0.0f ? p.softcap * kLog2e : 0.0f;
  a.alibi = p.alibi_slopes;
  a.alibi_batch_stride = p.alibi_batch_stride;
  // causal is the window (left, 0); an absent side is unbounded.
  a.win_left = p.window_left >= 0 ? p.window_left : kUnbounded;
  a.win_right = p.causal ? 0 : (p.window_right >= 0 ? p.window_right : kUnbounded);
  a.out_accum = p.out_accum;
  a.lse_accum = p.lse_accum;
  a.errors = p.errors;
  a.error_op = p.error_op;
  return a;
}

// The forward kernel's launch: PDL by default, after any kernel too (unlike the short
// elementwise kernels, a decode call after a GEMM was faster with it: benchmarks/NOTES.md), in
// clusters of plan.cluster CTAs along grid x when the splits merge in a cluster.
cudaError_t launch_fwd(const Plan& plan, dim3 grid, const FwdArgs& args, pdl::Request pdl_request,
                       cudaStream_t stream) {
  return pdl::launch(pdl_request, pdl::ByDefault::kPdl,
                     pdl::Cluster{static_cast<unsigned>(plan.cluster)}, plan.kernel.fn, grid,
                     dim3(plan.kernel.threads), static_cast<size_t>(plan.smem), stream, args);
}

// The Hopper kernel runs the params on capability 9.0 (the only one of major 9; its sm_90a code
// runs there alone) unless the caller turned it off.
bool use_hopper(const AttnFwdParams& p, const DeviceInfo& dev) {
  return dev.cc_major == 9 && p.allow_hopper && sm90::supports(p);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public entry points (attention_cuda.h).
// ---------------------------------------------------------------------------------------------
int64_t attn_fwd_accum_splits(const AttnFwdParams& p) {
  bool empty = false;
  if (!params_ok(p, &empty)) return -1;
  if (empty) return 0;
  DeviceInfo dev;
  if (device_info(&dev) != cudaSuccess) return -1;
  if (use_hopper(p, dev)) return 0;  // it never splits the keys
  Plan plan;
  if (!plan_tiles(p, dev, &plan)) return -1;
  if (plan_splits(p, dev, &plan) != cudaSuccess) return -1;
  if (plan_cluster(p, dev, &plan) != cudaSuccess) return -1;
  return plan.num_splits > 1 && plan.cluster == 1 ? plan.num_splits : 0;
}

bool attn_fwd_tile_counter_needed(const AttnFwdParams& p) {
  bool empty = false;
  if (!params_ok(p, &empty) || empty) return false;
  DeviceInfo dev;
  if (device_info(&dev) != cudaSuccess) return false;
  // Causal and windowed tiles read unequal numbers of key blocks.
  return use_hopper(p, dev) && (p.causal || p.window_left >= 0 || p.window_right >= 0);
}

int64_t attn_bwd_hopper_workspace(const AttnBwdParams& p) {
  DeviceInfo dev;
  if (device_info(&dev) != cudaSuccess) return 0;
  if (dev.cc_major != 9 || !p.fwd.allow_hopper || !sm90::bwd_supports(p)) return 0;
  return sm90::bwd_workspace_floats(p, dev.sms);
}

cudaError_t attn_bwd_hopper(const AttnBwdParams& p, float* workspace, cudaStream_t stream) {
  DeviceInfo dev;
  const cudaError_t err = device_info(&dev);
  return err != cudaSuccess ? err : sm90::bwd(p, dev.sms, workspace, stream);
}

cudaError_t attn_fwd(const AttnFwdParams& p, cudaStream_t stream) {
  bool empty = false;
  if (!params_ok(p, &empty)) return cudaErrorInvalidValue;
  if (empty) return cudaSuccess;
  DeviceInfo dev;
  cudaError_t err = device_info(&dev);
  if (err != cudaSuccess) return err;
  if (use_hopper(p, dev)) return sm90::fwd(p, dev.sms, dev.l2_bytes, stream);
  Plan plan;
  if (!plan_tiles(p, dev, &plan)) return cudaErrorInvalidValue;
  err = plan_splits(p, dev, &plan);
  if (err != cudaSuccess) return err;
  err = plan_cluster(p, dev, &plan);
  if (err != cudaSuccess) return err;
  if (plan.num_splits > 1 && plan.cluster == 1) {
    if (p.out_accum == nullptr || p.lse_accum == nullptr || !aligned_to(p.out_accum, 16) ||
        !aligned_to(p.lse_accum, 4)) {
      return cudaErrorInvalidValue;
    }
  }
  int occ = 0;
  err = plan.kernel.prepare(&occ);  // opt-in shared memory (cached per device)
  if (err != cudaSuccess) return err;
  FwdArgs args = make_args(p, plan);
  const int64_t grid_x = static_cast<int64_t>(plan.m_blocks) * plan.num_splits;
  // Fewer than 2^31 CTAs per launch (tile_coords' index math); batch chunks within grid z.
  const int64_t pair_ctas = grid_x * plan.heads_grid;
  if (pair_ctas > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  const int64_t max_chunk =
      min64(LaunchConfig::kMaxGridYZ, std::numeric_limits<int32_t>::max() / pair_ctas);
  for (int64_t base = 0; base < p.batch; base += max_chunk) {
    const int64_t chunk = min64(p.batch - base, max_chunk);
    args.batch_base = static_cast<int>(base);
    // The tile group depends on the chunk's pair count.
    args.tile_group = plan_tile_group(p, dev, plan, grid_x, chunk);
    args.group_ctas_div = FastDivU32::make(static_cast<uint32_t>(grid_x) * args.tile_group);
    args.tile_group_div = FastDivU32::make(args.tile_group);
    const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(plan.heads_grid),
                    static_cast<unsigned>(chunk));
    err = launch_fwd(plan, grid, args, p.pdl_request, stream);
    if (err != cudaSuccess) return err;
  }
  if (plan.num_splits == 1 || plan.cluster > 1) return cudaSuccess;

  CombineArgs c{};
  c.out_accum = p.out_accum;
  c.lse_accum = p.lse_accum;
  c.out = p.out;
  c.out_batch_stride = p.out_batch_stride;
  c.out_row_stride = p.out_row_stride;
  c.out_head_stride = p.out_head_stride;
  c.lse = p.lse;
  c.lse_batch_stride = p.lse_batch_stride;
  c.lse_head_stride = p.lse_head_stride;
  c.cu_seqlens_q = p.cu_seqlens_q;
  c.batch = static_cast<int>(p.batch);
  c.heads_q = static_cast<int>(p.heads_q);
  c.seqlen_q = static_cast<int>(p.seqlen_q);
  c.head_dim = static_cast<int>(p.head_dim);
  c.num_splits = plan.num_splits;
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  if (rows > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows));  // one CTA per output row
  const dim3 block(32 * LaunchConfig::kCombineWarps);
  constexpr size_t kSmem = sizeof(CombineSmem);
  constexpr auto kPdl = pdl::ByDefault::kPdl;  // the combine follows the split kernel
  return p.dtype == DType::kBFloat16
             ? pdl::launch(p.pdl_request, kPdl, combine_kernel<__nv_bfloat16>(), grid, block, kSmem,
                           stream, c)
             : pdl::launch(p.pdl_request, kPdl, combine_kernel<__half>(), grid, block, kSmem,
                           stream, c);
}

}  // namespace cuda
}  // namespace attention
