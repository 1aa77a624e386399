// attention_ops.cpp: the Torch-facing layer of the attention ops (prototypes: torch_binding.h).
//
// For each op it validates the tensors (dtype, device, shapes, strides, overlap) with messages
// that name the op and the argument and print expected vs. got, maps the call onto the strided
// views of kernel_src/attention_params.h / cache_params.h (no copy of anything read or written),
// and runs the CPU implementation (-DCPU_KERNEL builds) or launches the CUDA kernels on the
// current stream of q's device under a device guard (-DCUDA_KERNEL builds).
//
// Rules (attention_params.h has the math):
// - dtypes: q is float16 or bfloat16 (CUDA) or also float32 (CPU); k, v, out: q's dtype; lse and
//   alibi_slopes float32; every index tensor int32, 1-D (block_table 2-D), contiguous. Every
//   tensor on q's device.
// - heads: q's head count is a positive multiple of k's (MQA / GQA); head_dim is the same for q,
//   k and v, > 0, and at most 256 on CUDA. The CUDA kernels take multiples of 8 (each runs the
//   next instantiated head dim with the columns past it zero-filled); any other head dim is run on
//   zero-padded copies of q, k and v (the caches too, for fwd_kvcache) and written back into out
//   (pad_head_dim).
// - layout: q, k, v and out need unit stride along head_dim (a stride of 1 in the last
//   dimension); the other dimensions may have any strides (views of packed qkv tensors, the
//   transposed [B, H, S, D] tensors of transformers). A written tensor (out, lse; the caches of
//   fwd_kvcache with new k / v, of reshape_and_cache) must not share memory with any other
//   argument: an exact test (torch_checks::may_overlap), also for strided views of one buffer.
// - index values (cu_seqlens, seqused_k, block_table, kv_batch_idx, leftpad_k): the shapes and
//   dtypes are checked here for every device; the values are checked here for CPU tensors
//   (reading them is free there), with an error naming the argument, the index and the value.
//   On CUDA reading them would synchronize with the device, so they are trusted (flash-attn's
//   behaviour), except the ones that decide where a KV cache is read or written: the KV-cache
//   writers check their slots, cache rows, block ids and batch indices on the device
//   (cache_cuda.h), and the attention kernel checks each key length against the rows its
//   sequence has (its block-table row, its cache; attention_params.h).
// - device-detected errors (kernel_src/device_errors.h): a CUDA kernel that meets such a value
//   reads and writes nothing out of range (the write is skipped; the sequence's out / lse rows
//   become NaN) and reports it, the first report winning, into a per-device record in mapped
//   pinned host memory, allocated once, at the first CUDA call (also inside a graph capture).
//   There is no device assertion (it would end the CUDA context) and no synchronization (a
//   decode step cannot afford one and a graph capture forbids it): every later CUDA call of
//   these ops reads the record first (a load from host memory) and, when it is set, clears it
//   and raises a RuntimeError saying what an earlier call did wrong. The Python function
//   check_kvcache_errors (the op of the same name) synchronizes and raises the same way. A
//   CUDA graph keeps the record's address, valid for the life of the process; errors of its
//   replays surface at the next eager call or check_kvcache_errors. On the CPU these values are
//   checked before anything is written, so the same inputs raise at once.
// - empty calls (no sequence, no query row, no head) launch nothing after the checks; a
//   sequence with no visible key gives out = 0 and lse = +inf.
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_params.h"
#include "cache_params.h"
#include "device_errors.h"
#include "torch_binding.h"
#include "torch_checks.h"

#if defined(CPU_KERNEL)
#include "attention_cpu.h"
#include "cache_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "attention_cuda.h"
#include "cache_cuda.h"
#endif

namespace {

using attention::AttnFwdParams;
using attention::DType;
using OptTensor = std::optional<at::Tensor>;

// ---- small helpers (the shared checks: torch_checks.h) ----

using torch_checks::check_device_of;
using torch_checks::check_dtype_of;
using torch_checks::dtype_name;
using torch_checks::present;
using torch_checks::unit_last_stride;

std::optional<DType> to_dtype(at::ScalarType t) { return torch_checks::to_dtype<DType>(t); }

// The attention ops' dtypes: the kernels' three, and float64 (the CPU only, for gradient checks;
// the KV-cache writers keep to_dtype's three).
std::optional<DType> attention_dtype(at::ScalarType t) {
  return t == at::kDouble ? std::optional<DType>(DType::kFloat64) : to_dtype(t);
}

// ATTENTION_CLUSTER_MERGE=0 makes split-KV decode merge its splits in the combine kernel instead
// of a thread-block cluster (AttnFwdParams::allow_cluster_merge): a switch for benchmarks and for
// the test that both merge paths agree, read once per process. Results are the same either way.
bool cluster_merge_allowed() {
  static const bool allowed = [] {
    const char* value = std::getenv("ATTENTION_CLUSTER_MERGE");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return allowed;
}

// ATTENTION_HOPPER=0 runs every CUDA call on the stage-1 kernels (and every backward on the
// mma.sync ones), also on capability 9.0 where the Hopper kernels would take it
// (AttnFwdParams::allow_hopper, kernel_src/attention_sm90.h): a switch
// for benchmarks and for the tests that compare the two paths, read at every call (a benchmark
// times both paths in one process; the lookup is far below a launch's cost).
bool hopper_allowed() {
  const char* value = std::getenv("ATTENTION_HOPPER");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

using Named = std::pair<const char*, const at::Tensor*>;

// Each written tensor must not share memory with any other tensor of the call, written or read
// (torch_checks::may_overlap: exact, also for strided views of one buffer such as a packed qkv
// tensor): "<op>: <written> must not share memory with <other>".
void check_no_overlap(const char* op, const std::vector<Named>& written,
                      const std::vector<Named>& read) {
  for (size_t i = 0; i < written.size(); ++i) {
    for (size_t j = i + 1; j < written.size(); ++j) {
      torch_checks::check_no_overlap(op, written[i].first, *written[i].second, written[j].first,
                                     *written[j].second, " (both are written)");
    }
    for (const auto& [name, t] : read) {
      torch_checks::check_no_overlap(op, written[i].first, *written[i].second, name, *t);
    }
  }
}

// The given optional tensors, by name, appended to `list`.
void add_present(std::vector<Named>& list,
                 std::initializer_list<std::pair<const char*, const OptTensor*>> opts) {
  for (const auto& [name, t] : opts) {
    if (present(*t)) list.emplace_back(name, &**t);
  }
}

#if defined(CUDA_KERNEL)
// ---- errors reported by the CUDA kernels (see the file header; kernel_src/device_errors.h) ----

using attention::DeviceErrorCode;
using attention::DeviceErrorOp;
using attention::DeviceErrorRecord;

std::mutex& device_errors_mutex() {
  static std::mutex mutex;
  return mutex;
}

// One record per device, in one mapped pinned allocation made at the first CUDA call and kept for
// the life of the process (CUDA graphs keep its address). Host-allocated memory has the same
// address on the host and on every device (unified addressing, which every supported platform
// has). A first call inside a graph capture allocates in relaxed capture mode: the allocation
// enqueues no work, so it is legal there and leaves the capture intact. Should it fail, the call
// runs without a record (null: the kernels still never read or write out of range and still write
// NaN, they just report nothing), with a warning, and the next call tries again.
DeviceErrorRecord* device_error_records() {
  static std::atomic<DeviceErrorRecord*> records{nullptr};
  DeviceErrorRecord* ready = records.load(std::memory_order_acquire);
  if (ready != nullptr) return ready;
  const std::lock_guard<std::mutex> lock(device_errors_mutex());
  ready = records.load(std::memory_order_acquire);
  if (ready != nullptr) return ready;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  void* ptr = nullptr;
  if (err == cudaSuccess) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    err = cudaHostAlloc(&ptr, sizeof(DeviceErrorRecord) * static_cast<size_t>(count),
                        cudaHostAllocMapped | cudaHostAllocPortable);
    cudaThreadExchangeStreamCaptureMode(&mode);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: leave no error for the next launch check
    TORCH_WARN("attention: no pinned host memory for the device error records (",
               cudaGetErrorString(err),
               "): index values out of range found by the CUDA kernels of this call are not "
               "reported");
    return nullptr;
  }
  std::memset(ptr, 0, sizeof(DeviceErrorRecord) * static_cast<size_t>(count));
  records.store(static_cast<DeviceErrorRecord*>(ptr), std::memory_order_release);
  return static_cast<DeviceErrorRecord*>(ptr);
}

// The ops that report to the device error record, by the name their checks use (one table for
// both directions: the id a launch records and the name an error message prints).
constexpr std::pair<const char*, DeviceErrorOp> kErrorOps[] = {
    {"attn_fwd", DeviceErrorOp::kAttnFwd},
    {"fwd", DeviceErrorOp::kFwd},
    {"varlen_fwd", DeviceErrorOp::kVarlenFwd},
    {"fwd_kvcache", DeviceErrorOp::kFwdKvcache},
    {"reshape_and_cache", DeviceErrorOp::kReshapeAndCache},
    {"reshape_and_cache_flash", DeviceErrorOp::kReshapeAndCacheFlash}};

DeviceErrorOp error_op_of(const char* op) {
  for (const auto& [name, id] : kErrorOps) {
    if (std::strcmp(name, op) == 0) return id;
  }
  return DeviceErrorOp::kNone;
}

const char* error_op_name(DeviceErrorOp op) {
  for (const auto& [name, id] : kErrorOps) {
    if (id == op) return name;
  }
  return "an attention op";
}

// What a record says, as a sentence naming the arguments of the op that reported it.
std::string describe_device_error(const DeviceErrorRecord& r, const at::Device& device) {
  const auto op = static_cast<DeviceErrorOp>(r.op);
  const bool kvcache = op == DeviceErrorOp::kFwdKvcache;
  const char* op_name = error_op_name(op);
  const char* lengths = kvcache ? "cache_seqlens + new keys - cache_leftpad"
                                : "seqused_k, or the cu_seqlens_k difference";
  const char* cache = kvcache ? "k_cache" : "k";
  std::ostringstream m;
  m << "an earlier call of " << op_name << " on " << device << " was given ";
  switch (static_cast<DeviceErrorCode>(r.code)) {
    case DeviceErrorCode::kKeysPastBlockTable:
      m << "a key length past its block_table: sequence " << r.seq << " uses " << r.value
        << " keys (" << lengths << "), but its block_table row holds " << r.limit
        << " rows (max_blocks_per_seq x page_block_size); its out and softmax_lse rows are NaN";
      break;
    case DeviceErrorCode::kKeysPastCache:
      m << "a key length past its cache: sequence " << r.seq << " uses " << r.value << " keys ("
        << lengths << "), but " << cache << " has " << r.limit
        << " rows for it; its out and softmax_lse rows are NaN";
      break;
    case DeviceErrorCode::kAppendPastBlockTable:
      m << "a full block_table: new key " << r.index << " of sequence " << r.seq << " goes to row "
        << r.value << " (cache_seqlens[" << r.seq << "] + " << r.index
        << "), but its block_table row holds " << r.limit
        << " rows (max_blocks_per_seq x page_block_size); the key was not written";
      break;
    case DeviceErrorCode::kAppendPastCache:
      m << "a full cache: new key " << r.index << " of sequence " << r.seq << " goes to row "
        << r.value << " (cache_seqlens[" << r.seq << "] + " << r.index << "), but k_cache has "
        << r.limit << " rows per sequence; the key was not written";
      break;
    case DeviceErrorCode::kNegativeCacheSeqlens:
      m << "cache_seqlens[" << r.seq << "] = " << r.value
        << " < 0; the new keys of that sequence were not written";
      break;
    case DeviceErrorCode::kBlockTableValue:
      m << "block_table[" << r.seq << ", " << r.index << "] = " << r.value
        << ", outside the cache of " << r.limit
        << " blocks (k_cache.size(0)); the new key was not written";
      break;
    case DeviceErrorCode::kCacheBatchIdx:
      m << "cache_batch_idx[" << r.seq << "] = " << r.value << ", outside the batch of k_cache ("
        << r.limit << "); the new key was not written";
      break;
    case DeviceErrorCode::kRotaryRows:
      m << "rotary_cos / rotary_sin of " << r.limit << " rows, but token " << r.index
        << " of sequence " << r.seq << " needs row " << r.value
        << "; its key was not written (or its query row is NaN)";
      break;
    case DeviceErrorCode::kSlotMapping:
      m << "slot_mapping[" << r.seq << "] = " << r.value << ", outside the cache of " << r.limit
        << " slots (num_blocks x block_size); that token was not written";
      break;
    default:
      m << "an index out of range (code " << r.code << ")";
  }
  return m.str();
}

// The record of `device` for a kernel launch, after raising the error an earlier call left in it
// (then cleared). Reading it costs a load from host memory, no synchronization.
DeviceErrorRecord* take_device_errors(const char* op, const at::Device& device) {
  DeviceErrorRecord* const records = device_error_records();
  if (records == nullptr) return nullptr;
  DeviceErrorRecord* record = records + device.index();
  volatile DeviceErrorRecord* r = record;
  if (r->code == 0) return record;
  DeviceErrorRecord seen;
  {
    const std::lock_guard<std::mutex> lock(device_errors_mutex());
    if (r->code == 0) return record;                      // another thread took it
    std::atomic_thread_fence(std::memory_order_acquire);  // code was published after the fields
    seen.code = r->code;
    seen.op = r->op;
    seen.seq = r->seq;
    seen.index = r->index;
    seen.value = r->value;
    seen.limit = r->limit;
    r->code = 0;
    r->epoch = r->epoch + 1;  // the next report may claim the record (device_errors.cuh)
  }
  TORCH_CHECK(false, op, ": ", describe_device_error(seen, device),
              ". The device detected it (index values of CUDA tensors are checked there: reading "
              "them on the host would synchronize), so it is raised here, at the next call of "
              "these ops on the device (or by check_kvcache_errors()); nothing outside the "
              "tensors was read or written");
  return record;
}

// A head dim that is not a multiple of 8 (59, 111): the CUDA kernels move 16-byte chunks of whole
// columns, so they read zero-padded copies (zero columns add nothing to the scores and give zero
// output columns; flash-attn pads the same way). A [.., D] tensor -> a contiguous copy
// [.., padded] (of the whole tensor: of the whole cache for fwd_kvcache), padded >= D.
at::Tensor pad_head_dim(const at::Tensor& t, int64_t padded) {
  return at::constant_pad_nd(t, {0, padded - t.size(-1)}).contiguous();
}

// The head dim the CUDA kernels run a call at: the caller's, rounded up to a multiple of 8 (their
// 16-byte chunks); a larger one means zero-padded copies (pad_head_dim).
int64_t kernel_head_dim(int64_t head_dim) { return (head_dim + 7) / 8 * 8; }

// 16-byte aligned base pointer and batch / row / head strides (the CUDA kernels' 16-byte chunks).
bool aligned16(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 != 0) return false;
  const int64_t elems = 16 / static_cast<int64_t>(t.element_size());
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) % elems != 0) return false;
  }
  return true;
}
#endif

constexpr int64_t kMaxHeadDimCuda = 256;

// Runs the implementation's call and names the op in its errors.
template <typename F>
void on_cpu(const char* op, F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, op, ": ", e.msg());
  }
}

// ---- the general attention call ----

// Argument names of one call, as the public op (and the Python function above it) spells them.
struct Names {
  const char* q = "q";
  const char* k = "k";
  const char* v = "v";
  const char* out = "out";
  const char* lse = "lse";
  const char* cu_seqlens_q = "cu_seqlens_q";
  const char* cu_seqlens_k = "cu_seqlens_k";
  const char* seqused_k = "seqused_k";
  const char* seqused_note =
      "";  // what seqused_k stands for when it was derived from other arguments
  const char* block_table = "block_table";
  const char* kv_batch_idx = "kv_batch_idx";
  const char* leftpad_k = "leftpad_k";
  const char* alibi_slopes = "alibi_slopes";
  const char* max_seqlen_q = "max_seqlen_q";
  const char* max_seqlen_k = "max_seqlen_k";
};

struct AttentionCall {
  const char* op = "";
  Names names;
  at::Tensor out, q, k, v;
  OptTensor lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, kv_batch_idx, leftpad_k,
      alibi_slopes;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  double softmax_scale = 1.0, softcap = 0.0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1, num_splits = 0;
  std::function<void()> before_launch;  // runs after every check, before the kernel (zero_tensors)
  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl
  // CUDA: the device's error record when the caller took it already (fwd_kvcache, before its
  // append); else run_attention takes it.
  attention::DeviceErrorRecord* errors = nullptr;
};

// Sizes derived from the checked tensors.
struct Geometry {
  bool varlen_q = false, varlen_k = false, paged = false;
  int64_t batch = 0, total_q = 0, seqlen_q = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  int64_t batch_k = 0, seqlen_k = 0,
          total_k = 0;  // dense: [batch_k, seqlen_k]; varlen: total_k rows
  int64_t num_blocks = 0, block_size = 0, max_blocks = 0;
};

void check_device(const AttentionCall& c, const char* name, const at::Tensor& t) {
  check_device_of(c.op, name, t, c.names.q, c.q);
}

void check_int32(const AttentionCall& c, const char* name, const at::Tensor& t, int64_t dims,
                 const char* layout) {
  check_device(c, name, t);
  TORCH_CHECK(t.scalar_type() == at::kInt, c.op, ": ", name, " must be int32, got ",
              dtype_name(t.scalar_type()));
  TORCH_CHECK(t.dim() == dims, c.op, ": ", name, " must have shape ", layout, ", got ", t.sizes());
  if (dims == 1) {
    TORCH_CHECK(t.is_contiguous(), c.op, ": ", name, " must be contiguous, got strides ",
                t.strides());
  } else {
    TORCH_CHECK(unit_last_stride(t), c.op, ": ", name,
                " must have stride 1 along its last dimension, got strides ", t.strides());
  }
}

void check_vector(const AttentionCall& c, const char* name, const at::Tensor& t, int64_t expected,
                  const char* what) {
  check_int32(c, name, t, 1, what);
  torch_checks::check_shape(c.op, name, t, {expected}, what);
}

// [batch + 1] cumulative lengths -> [batch] lengths (the key lengths of a paged
// cache, flash-attn passes them as cu_seqlens_k).
at::Tensor lengths_of(const at::Tensor& cu) {
  return cu.narrow(0, 1, cu.size(0) - 1).sub(cu.narrow(0, 0, cu.size(0) - 1)).to(at::kInt);
}

// Index values of a CPU call (see the file header).
void check_index_values_cpu(const AttentionCall& c, const Geometry& g) {
  const Names& n = c.names;
  auto check_cu = [&](const at::Tensor& cu, const char* name, int64_t total, int64_t max_len,
                      const char* max_name) {
    const int32_t* v = cu.const_data_ptr<int32_t>();
    TORCH_CHECK(v[0] >= 0, c.op, ": ", name, "[0] = ", v[0], " must be >= 0");
    for (int64_t b = 0; b < g.batch; ++b) {
      const int64_t len = static_cast<int64_t>(v[b + 1]) - v[b];
      TORCH_CHECK(len >= 0, c.op, ": ", name, " must be non-decreasing, got ", name, "[", b,
                  "] = ", v[b], " > ", name, "[", b + 1, "] = ", v[b + 1]);
      TORCH_CHECK(len <= max_len, c.op, ": ", name, ": sequence ", b, " has ", len,
                  " tokens, more than ", max_name, " = ", max_len);
    }
    TORCH_CHECK(v[g.batch] <= total, c.op, ": ", name, "[", g.batch, "] = ", v[g.batch],
                " exceeds the number of packed rows (", total, ")");
  };
  if (g.varlen_q) check_cu(*c.cu_seqlens_q, n.cu_seqlens_q, g.total_q, g.seqlen_q, n.max_seqlen_q);
  if (g.varlen_k) check_cu(*c.cu_seqlens_k, n.cu_seqlens_k, g.total_k, g.seqlen_k, n.max_seqlen_k);
  const int32_t* kv_idx =
      present(c.kv_batch_idx) ? c.kv_batch_idx->const_data_ptr<int32_t>() : nullptr;
  const int32_t* leftpad = present(c.leftpad_k) ? c.leftpad_k->const_data_ptr<int32_t>() : nullptr;
  const int32_t* used = present(c.seqused_k) ? c.seqused_k->const_data_ptr<int32_t>() : nullptr;
  for (int64_t b = 0; b < g.batch; ++b) {
    if (kv_idx != nullptr) {
      TORCH_CHECK(kv_idx[b] >= 0 && kv_idx[b] < g.batch_k, c.op, ": ", n.kv_batch_idx, "[", b,
                  "] = ", kv_idx[b], " is outside the batch of ", n.k, " [0, ", g.batch_k, ")");
    }
    int64_t available;  // key rows sequence b may use
    if (g.paged) {
      available = g.max_blocks * g.block_size;
    } else if (g.varlen_k) {
      const int32_t* cu = c.cu_seqlens_k->const_data_ptr<int32_t>();
      available = static_cast<int64_t>(cu[b + 1]) - cu[b];
    } else {
      available = g.seqlen_k;
      if (leftpad != nullptr) {
        TORCH_CHECK(leftpad[b] >= 0 && leftpad[b] <= g.seqlen_k, c.op, ": ", n.leftpad_k, "[", b,
                    "] = ", leftpad[b], " is outside [0, ", g.seqlen_k, "] (the rows of ", n.k,
                    ")");
        available -= leftpad[b];
      }
    }
    int64_t len_k = available;
    if (used != nullptr) {
      TORCH_CHECK(used[b] >= 0, c.op, ": ", n.seqused_k, "[", b, "]: sequence ", b, " uses ",
                  used[b], " keys", n.seqused_note, " (valid: 0 .. ", available, ")");
      if (g.paged) {
        TORCH_CHECK(used[b] <= available, c.op, ": ", n.seqused_k, "[", b, "]: sequence ", b,
                    " uses ", used[b], " keys", n.seqused_note, ", but its ", n.block_table,
                    " row holds ", available, " rows (max_blocks_per_seq ", g.max_blocks,
                    " x page_block_size ", g.block_size, ")");
      } else {
        TORCH_CHECK(used[b] <= available, c.op, ": ", n.seqused_k, "[", b, "]: sequence ", b,
                    " uses ", used[b], " keys", n.seqused_note, ", but ", n.k, " has ", available,
                    " rows for it", leftpad != nullptr ? " after its left padding" : "",
                    " (valid: 0 .. ", available, ")");
      }
      len_k = used[b];
    }
    if (g.paged && len_k > 0) {
      const at::Tensor& bt = *c.block_table;
      const int32_t* row = bt.const_data_ptr<int32_t>() + b * bt.stride(0);
      const int64_t blocks = (len_k + g.block_size - 1) / g.block_size;
      for (int64_t i = 0; i < blocks; ++i) {
        TORCH_CHECK(row[i] >= 0 && row[i] < g.num_blocks, c.op, ": ", n.block_table, "[", b, ", ",
                    i, "] = ", row[i], " is outside the cache of ", g.num_blocks, " blocks (", n.k,
                    ".size(0)); sequence ", b, " uses ", blocks, " blocks for its ", len_k,
                    " keys");
      }
    }
  }
}

Geometry check(AttentionCall& c) {
  const Names& n = c.names;
  const char* op = c.op;
  Geometry g;
  const at::Device device = c.q.device();
  const std::optional<DType> dtype = attention_dtype(c.q.scalar_type());
  if (device.is_cuda()) {
    TORCH_CHECK(c.q.scalar_type() == at::kHalf || c.q.scalar_type() == at::kBFloat16, op, ": ", n.q,
                " must be float16 or bfloat16 on CUDA, got ", dtype_name(c.q.scalar_type()));
  } else {
    TORCH_CHECK(dtype.has_value(), op, ": ", n.q,
                " must be float32, float16, bfloat16 or float64, got ",
                dtype_name(c.q.scalar_type()));
  }
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor*>{n.k, &c.k}, {n.v, &c.v}, {n.out, &c.out}}) {
    check_device(c, name, *t);
    check_dtype_of(op, name, *t, n.q, c.q);
  }

  // q
  g.varlen_q = present(c.cu_seqlens_q);
  if (g.varlen_q) {
    TORCH_CHECK(c.q.dim() == 3, op, ": ", n.q,
                " must have shape [total_q, num_heads, head_dim] with ", n.cu_seqlens_q, ", got ",
                c.q.sizes());
    check_int32(c, n.cu_seqlens_q, *c.cu_seqlens_q, 1, "[batch + 1]");
    TORCH_CHECK(c.cu_seqlens_q->size(0) >= 1, op, ": ", n.cu_seqlens_q,
                " must have shape [batch + 1], got ", c.cu_seqlens_q->sizes());
    g.batch = c.cu_seqlens_q->size(0) - 1;
    g.total_q = c.q.size(0);
    TORCH_CHECK(c.max_seqlen_q >= 0, op, ": ", n.max_seqlen_q, " must be >= 0, got ",
                c.max_seqlen_q);
    g.seqlen_q = c.max_seqlen_q;
  } else {
    TORCH_CHECK(c.q.dim() == 4, op, ": ", n.q,
                " must have shape [batch, seqlen_q, num_heads, head_dim], got ", c.q.sizes());
    g.batch = c.q.size(0);
    g.seqlen_q = c.q.size(1);
    g.total_q = g.batch * g.seqlen_q;
  }
  g.heads_q = c.q.size(-2);
  g.head_dim = c.q.size(-1);

  // k, v
  g.paged = present(c.block_table);
  if (g.paged && present(c.cu_seqlens_k)) {
    // flash-attn's paged varlen call: cu_seqlens_k holds the key lengths (seqused_k wins).
    check_vector(c, n.cu_seqlens_k, *c.cu_seqlens_k, g.batch + 1, "[batch + 1]");
    if (!present(c.seqused_k)) {
      c.seqused_k = lengths_of(*c.cu_seqlens_k);
      c.names.seqused_k = c.names.cu_seqlens_k;
      c.names.seqused_note =
          " (cu_seqlens_k[b + 1] - cu_seqlens_k[b], the key lengths of the paged cache)";
    }
    c.cu_seqlens_k.reset();
  }
  g.varlen_k = present(c.cu_seqlens_k);
  if (g.paged) {
    TORCH_CHECK(c.k.dim() == 4, op, ": ", n.k,
                " must be a paged cache [num_blocks, block_size, num_heads_k, head_dim] "
                "with ",
                n.block_table, ", got ", c.k.sizes());
    check_int32(c, n.block_table, *c.block_table, 2, "[batch, max_blocks_per_seq]");
    TORCH_CHECK(c.block_table->size(0) == g.batch, op, ": ", n.block_table,
                " must have shape [batch = ", g.batch, ", max_blocks_per_seq], got ",
                c.block_table->sizes());
    g.num_blocks = c.k.size(0);
    g.block_size = c.k.size(1);
    g.max_blocks = c.block_table->size(1);
    TORCH_CHECK(g.block_size > 0, op, ": ", n.k, " must have a block size > 0, got ", c.k.sizes());
    g.seqlen_k = g.max_blocks * g.block_size;
    TORCH_CHECK(!present(c.kv_batch_idx), op, ": ", n.kv_batch_idx, " cannot be combined with ",
                n.block_table, " (the block table selects each sequence's blocks)");
  } else if (g.varlen_k) {
    TORCH_CHECK(c.k.dim() == 3, op, ": ", n.k,
                " must have shape [total_k, num_heads_k, head_dim] with ", n.cu_seqlens_k, ", got ",
                c.k.sizes());
    check_vector(c, n.cu_seqlens_k, *c.cu_seqlens_k, g.batch + 1, "[batch + 1]");
    TORCH_CHECK(c.max_seqlen_k >= 0, op, ": ", n.max_seqlen_k, " must be >= 0, got ",
                c.max_seqlen_k);
    g.total_k = c.k.size(0);
    g.seqlen_k = c.max_seqlen_k;
    TORCH_CHECK(!present(c.kv_batch_idx), op, ": ", n.kv_batch_idx, " cannot be combined with ",
                n.cu_seqlens_k);
  } else {
    TORCH_CHECK(c.k.dim() == 4, op, ": ", n.k,
                " must have shape [batch, seqlen_k, num_heads_k, head_dim], got ", c.k.sizes());
    g.batch_k = c.k.size(0);
    g.seqlen_k = c.k.size(1);
    if (present(c.kv_batch_idx)) {
      check_vector(c, n.kv_batch_idx, *c.kv_batch_idx, g.batch, "one cache index per sequence");
    } else {
      TORCH_CHECK(g.batch_k == g.batch, op, ": ", n.k, " must have the batch size of ", n.q, " (",
                  g.batch, "), got shape ", c.k.sizes());
    }
  }
  TORCH_CHECK(!present(c.leftpad_k) || (!g.paged && !g.varlen_k), op, ": ", n.leftpad_k,
              " cannot be combined with ", g.paged ? n.block_table : n.cu_seqlens_k);
  TORCH_CHECK(c.v.sizes() == c.k.sizes(), op, ": ", n.v, " must have the shape of ", n.k, " ",
              c.k.sizes(), ", got ", c.v.sizes());
  g.heads_kv = c.k.size(-2);
  TORCH_CHECK(g.heads_kv > 0 && g.heads_q % g.heads_kv == 0, op, ": the number of heads of ", n.q,
              " (", g.heads_q, ") must be a multiple of that of ", n.k, " and ", n.v, " (",
              g.heads_kv, ")");
  TORCH_CHECK(c.k.size(-1) == g.head_dim, op, ": ", n.k, " must have the head_dim of ", n.q, " (",
              g.head_dim, "), got shape ", c.k.sizes());
  if (device.is_cuda()) {
    TORCH_CHECK(g.head_dim > 0 && g.head_dim <= kMaxHeadDimCuda, op, ": head_dim ", g.head_dim,
                " of ", n.q, " is not supported on CUDA (supported: 1 to ", kMaxHeadDimCuda, ")");
  } else {
    TORCH_CHECK(g.head_dim > 0, op, ": head_dim of ", n.q, " must be > 0, got shape ", c.q.sizes());
  }
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{n.q, &c.q},
                                {n.k, &c.k},
                                {n.v, &c.v},
                                {n.out, &c.out}}) {
    TORCH_CHECK(unit_last_stride(*t), op, ": ", name,
                " must have stride 1 along its last dimension (head_dim), got "
                "strides ",
                t->strides());
  }

  // out, lse
  TORCH_CHECK(c.out.sizes() == c.q.sizes(), op, ": ", n.out, " must have the shape of ", n.q, " ",
              c.q.sizes(), ", got ", c.out.sizes());
  if (present(c.lse)) {
    const at::Tensor& lse = *c.lse;
    check_device(c, n.lse, lse);
    TORCH_CHECK(lse.scalar_type() == at::kFloat, op, ": ", n.lse, " must be float32, got ",
                dtype_name(lse.scalar_type()));
    if (g.varlen_q) {
      TORCH_CHECK(lse.dim() == 2 && lse.size(0) == g.heads_q && lse.size(1) == g.total_q, op, ": ",
                  n.lse, " must have shape [num_heads = ", g.heads_q, ", total_q = ", g.total_q,
                  "], got ", lse.sizes());
    } else {
      TORCH_CHECK(lse.dim() == 3 && lse.size(0) == g.batch && lse.size(1) == g.heads_q &&
                      lse.size(2) == g.seqlen_q,
                  op, ": ", n.lse, " must have shape [batch = ", g.batch,
                  ", num_heads = ", g.heads_q, ", seqlen_q = ", g.seqlen_q, "], got ", lse.sizes());
    }
    TORCH_CHECK(unit_last_stride(lse), op, ": ", n.lse,
                " must have stride 1 along its last dimension, got strides ", lse.strides());
  }

  // per-sequence vectors
  if (present(c.seqused_k))
    check_vector(c, n.seqused_k, *c.seqused_k, g.batch, "keys used per sequence");
  if (present(c.leftpad_k))
    check_vector(c, n.leftpad_k, *c.leftpad_k, g.batch, "left padding per sequence");
  if (present(c.alibi_slopes)) {
    const at::Tensor& a = *c.alibi_slopes;
    check_device(c, n.alibi_slopes, a);
    TORCH_CHECK(a.scalar_type() == at::kFloat, op, ": ", n.alibi_slopes, " must be float32, got ",
                dtype_name(a.scalar_type()));
    const bool shape_ok = (a.dim() == 1 && a.size(0) == g.heads_q) ||
                          (a.dim() == 2 && a.size(0) == g.batch && a.size(1) == g.heads_q);
    TORCH_CHECK(shape_ok, op, ": ", n.alibi_slopes, " must have shape [num_heads = ", g.heads_q,
                "] or [batch = ", g.batch, ", num_heads = ", g.heads_q, "], got ", a.sizes());
    TORCH_CHECK(unit_last_stride(a), op, ": ", n.alibi_slopes,
                " must have stride 1 along its last dimension, got strides ", a.strides());
  }

  // overlap: out and lse are written, everything else is read
  std::vector<Named> written = {{n.out, &c.out}};
  add_present(written, {{n.lse, &c.lse}});
  std::vector<Named> read = {{n.q, &c.q}, {n.k, &c.k}, {n.v, &c.v}};
  add_present(read, {{n.cu_seqlens_q, &c.cu_seqlens_q},
                     {n.cu_seqlens_k, &c.cu_seqlens_k},
                     {n.seqused_k, &c.seqused_k},
                     {n.block_table, &c.block_table},
                     {n.kv_batch_idx, &c.kv_batch_idx},
                     {n.leftpad_k, &c.leftpad_k},
                     {n.alibi_slopes, &c.alibi_slopes}});
  check_no_overlap(op, written, read);

  // scalars
  TORCH_CHECK(std::isfinite(c.softmax_scale), op, ": softmax_scale must be finite, got ",
              c.softmax_scale);
  TORCH_CHECK(c.softcap >= 0.0 && std::isfinite(c.softcap), op,
              ": softcap must be >= 0 (0: none), got ", c.softcap);
  TORCH_CHECK(c.num_splits >= 0, op, ": num_splits must be >= 0 (0: the backend's choice), got ",
              c.num_splits);
  c.window_left = c.window_left < 0 ? -1 : c.window_left;
  c.window_right = c.window_right < 0 ? -1 : c.window_right;
  if (c.causal) c.window_right = 0;

  if (device.is_cpu()) check_index_values_cpu(c, g);
  return g;
}

DType dtype_of(const at::Tensor& t) { return *attention_dtype(t.scalar_type()); }

// A stride as the params carry it: 0 for a dimension of size 1, whose stride is never used
// (PyTorch leaves it arbitrary; the CUDA kernels require every stride to be a whole number of
// 16-byte chunks).
int64_t stride(const at::Tensor& t, int64_t dim) { return t.size(dim) == 1 ? 0 : t.stride(dim); }

AttnFwdParams make_params(const AttentionCall& c, const Geometry& g) {
  AttnFwdParams p;
  p.dtype = dtype_of(c.q);
  p.batch = g.batch;
  p.heads_q = g.heads_q;
  p.heads_kv = g.heads_kv;
  p.head_dim = g.head_dim;
  p.seqlen_q = g.seqlen_q;
  p.seqlen_k = g.seqlen_k;

  p.q = c.q.const_data_ptr();
  p.out = c.out.mutable_data_ptr();
  if (g.varlen_q) {
    p.q_row_stride = stride(c.q, 0);
    p.q_head_stride = stride(c.q, 1);
    p.out_row_stride = stride(c.out, 0);
    p.out_head_stride = stride(c.out, 1);
  } else {
    p.q_batch_stride = stride(c.q, 0);
    p.q_row_stride = stride(c.q, 1);
    p.q_head_stride = stride(c.q, 2);
    p.out_batch_stride = stride(c.out, 0);
    p.out_row_stride = stride(c.out, 1);
    p.out_head_stride = stride(c.out, 2);
  }
  p.k = c.k.const_data_ptr();
  p.v = c.v.const_data_ptr();
  if (g.varlen_k) {
    p.k_row_stride = stride(c.k, 0);
    p.k_head_stride = stride(c.k, 1);
    p.v_row_stride = stride(c.v, 0);
    p.v_head_stride = stride(c.v, 1);
  } else {  // dense [B_k, S_k, H, D] or paged [num_blocks, block_size, H, D]
    p.k_batch_stride = stride(c.k, 0);
    p.k_row_stride = stride(c.k, 1);
    p.k_head_stride = stride(c.k, 2);
    p.v_batch_stride = stride(c.v, 0);
    p.v_row_stride = stride(c.v, 1);
    p.v_head_stride = stride(c.v, 2);
  }
  if (present(c.lse)) {
    p.lse = c.lse->mutable_data_ptr<float>();
    if (g.varlen_q) {
      p.lse_head_stride = c.lse->stride(0);
    } else {
      p.lse_batch_stride = c.lse->stride(0);
      p.lse_head_stride = c.lse->stride(1);
    }
  }
  auto ptr = [](const OptTensor& t) { return present(t) ? t->const_data_ptr<int32_t>() : nullptr; };
  p.cu_seqlens_q = ptr(c.cu_seqlens_q);
  p.cu_seqlens_k = ptr(c.cu_seqlens_k);
  if (g.varlen_q) p.total_q = g.total_q;
  if (g.varlen_k) p.total_k = g.total_k;
  p.seqused_k = ptr(c.seqused_k);
  p.kv_batch_idx = ptr(c.kv_batch_idx);
  p.leftpad_k = ptr(c.leftpad_k);
  if (g.paged) {
    p.block_table = c.block_table->const_data_ptr<int32_t>();
    p.block_table_batch_stride = c.block_table->stride(0);
    p.page_block_size = g.block_size;
    p.num_blocks = g.num_blocks;
  }
  p.softmax_scale = static_cast<float>(c.softmax_scale);
  p.softcap = static_cast<float>(c.softcap);
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  if (present(c.alibi_slopes)) {
    p.alibi_slopes = c.alibi_slopes->const_data_ptr<float>();
    p.alibi_batch_stride = c.alibi_slopes->dim() == 2 ? c.alibi_slopes->stride(0) : 0;
  }
  p.num_splits = c.num_splits;
  p.pdl_request = c.pdl_request;
  p.allow_cluster_merge = cluster_merge_allowed();
  p.allow_hopper = hopper_allowed();
  return p;
}

void run_attention(AttentionCall& c) {
  const Geometry g = check(c);
  if (c.before_launch) c.before_launch();
  if (g.batch == 0 || g.total_q == 0 || g.heads_q == 0 || (!g.varlen_q && g.seqlen_q == 0)) return;
  if (c.k.numel() == 0) {
    // No key row at all (a [B, 0, H, D] cache): every query row sees no key (out 0, lse +inf); the
    // kernels are not called with empty K/V tensors.
    c.out.zero_();
    if (present(c.lse)) c.lse->fill_(std::numeric_limits<float>::infinity());
    return;
  }
  AttnFwdParams p = make_params(c, g);
  const at::Device device = c.q.device();
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    p.num_splits = attention::cpu::attn_fwd_num_splits(p);
    on_cpu(c.op, [&] { attention::cpu::attn_fwd(p); });
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
    // The CUDA kernels move 16-byte chunks (attention_cuda.h): a q/k/v view that is not 16-byte
    // aligned (base pointer, or a batch/row/head stride not a multiple of 16 bytes) is read
    // through a contiguous copy, and an unaligned out / lse is written through a temporary.
    // A head dim that is not a multiple of 8 runs on zero-padded copies, out through a padded
    // temporary (pad_head_dim).
    AttentionCall a = c;
    Geometry gk = g;
    gk.head_dim = kernel_head_dim(g.head_dim);
    const bool padded = gk.head_dim != g.head_dim;
    if (padded) {
      a.q = pad_head_dim(a.q, gk.head_dim);
      a.k = pad_head_dim(a.k, gk.head_dim);
      a.v = pad_head_dim(a.v, gk.head_dim);
    }
    if (!aligned16(a.q)) a.q = a.q.contiguous();
    if (!aligned16(a.k) || !aligned16(a.v)) {
      a.k = a.k.contiguous();
      a.v = a.v.contiguous();
    }
    // With packed (varlen) queries the kernels leave the rows outside every sequence unwritten:
    // there the temporaries start as copies, so that those rows keep the caller's values (the
    // zeros of zero_tensors).
    const bool out_tmp = padded || !aligned16(a.out);
    if (out_tmp) {
      a.out =
          g.varlen_q ? pad_head_dim(c.out, gk.head_dim) : at::empty(a.q.sizes(), a.out.options());
    }
    const bool lse_tmp = present(a.lse) && reinterpret_cast<uintptr_t>(a.lse->data_ptr()) % 8 != 0;
    if (lse_tmp) a.lse = g.varlen_q ? a.lse->clone() : at::empty(a.lse->sizes(), a.lse->options());
    if (present(a.alibi_slopes) && !a.alibi_slopes->is_contiguous())
      a.alibi_slopes = a.alibi_slopes->contiguous();
    p = make_params(a, gk);
    p.errors = c.errors != nullptr ? c.errors : take_device_errors(c.op, device);
    p.error_op = error_op_of(c.op);
    const int64_t splits = attention::cuda::attn_fwd_accum_splits(p);
    at::Tensor out_accum, lse_accum;
    if (splits > 0) {
      const auto f32 = c.q.options().dtype(at::kFloat);
      out_accum = at::empty({splits, gk.batch, gk.heads_q, gk.seqlen_q, gk.head_dim}, f32);
      lse_accum = at::empty({splits, g.batch, g.heads_q, g.seqlen_q}, f32);
      p.out_accum = out_accum.mutable_data_ptr<float>();
      p.lse_accum = lse_accum.mutable_data_ptr<float>();
    }
    at::Tensor tile_counter;
    if (attention::cuda::attn_fwd_tile_counter_needed(p)) {
      // A memset instead of at::zeros: a fill kernel through the dispatcher cost about 20 us of
      // host time per call (H200 host, profiler), a memset node in a CUDA graph all the same.
      tile_counter = at::empty({1}, c.q.options().dtype(at::kInt));
      p.tile_counter = tile_counter.mutable_data_ptr<int32_t>();
      const cudaError_t zeroed = cudaMemsetAsync(p.tile_counter, 0, sizeof(int32_t), stream);
      TORCH_CHECK(zeroed == cudaSuccess, c.op,
                  ": zeroing the tile counter failed: ", cudaGetErrorString(zeroed));
    }
    const cudaError_t err = attention::cuda::attn_fwd(p, stream);
    TORCH_CHECK(err == cudaSuccess, c.op, ": CUDA launch failed: ", cudaGetErrorString(err));
    if (out_tmp) c.out.copy_(padded ? a.out.narrow(-1, 0, g.head_dim) : a.out);
    if (lse_tmp) c.lse->copy_(*a.lse);
    return;
  }
#endif
  TORCH_CHECK(false, c.op, ": no implementation for device ", device, " in this build");
}

// ---- flash-attn's C++ entry points ----

void check_no_dropout(const char* op, double p_dropout, bool return_softmax) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      p_dropout == 0.0, op, ": dropout (p_dropout = ", p_dropout,
      ") is not implemented: this kernel is forward-only without dropout (use p_dropout = 0)");
  TORCH_CHECK_NOT_IMPLEMENTED(
      !return_softmax, op,
      ": return_softmax (the attention probabilities S) is not implemented; the log-sum-exp "
      "is returned as softmax_lse");
}

// An output like q: q's strides when they are dense (flash-attn's empty_like), else contiguous.
at::Tensor output_like(const at::Tensor& q) {
  if (q.is_non_overlapping_and_dense()) return at::empty_like(q);
  return at::empty(q.sizes(), q.options());
}

at::Tensor given_or_new_out(const OptTensor& out, const at::Tensor& q) {
  return present(out) ? *out : output_like(q);
}

// ---- vLLM cache writers ----

attention::CacheLayout layout_of(const at::Tensor& t, bool split_key) {
  attention::CacheLayout c;
  c.data = t.mutable_data_ptr();
  c.block_stride = t.stride(0);
  if (split_key) {  // key [nb, H, D/x, bs, x]
    c.head_stride = t.stride(1);
    c.d_outer_stride = t.stride(2);
    c.row_stride = t.stride(3);
    c.d_inner_stride = t.stride(4);
    c.x = t.size(4);
  }
  return c;
}

void write_cache(const char* op, bool flash, const at::Tensor& key, const at::Tensor& value,
                 at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& slot_mapping,
                 const std::string& kv_cache_dtype, const OptTensor& k_scale,
                 const OptTensor& v_scale) {
  TORCH_CHECK_NOT_IMPLEMENTED(kv_cache_dtype == "auto", op, ": kv_cache_dtype '", kv_cache_dtype,
                              "' is not supported (only 'auto': the caches have the dtype of key)");
  (void)k_scale;
  (void)v_scale;
  const at::Device device = key.device();
  TORCH_CHECK(to_dtype(key.scalar_type()).has_value(), op,
              ": key must be float32, float16 or bfloat16, got ", dtype_name(key.scalar_type()));
  TORCH_CHECK(key.dim() == 3, op, ": key must have shape [num_tokens, num_heads, head_size], got ",
              key.sizes());
  TORCH_CHECK(value.sizes() == key.sizes(), op, ": value must have the shape of key ", key.sizes(),
              ", got ", value.sizes());
  const int64_t heads = key.size(1);
  const int64_t head_size = key.size(2);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"value", &value},
                                {"key_cache", &key_cache},
                                {"value_cache", &value_cache},
                                {"slot_mapping", &slot_mapping}}) {
    check_device_of(op, name, *t, "key", key);
  }
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"value", &value},
                                {"key_cache", &key_cache},
                                {"value_cache", &value_cache}}) {
    TORCH_CHECK(t->scalar_type() == key.scalar_type(), op, ": ", name,
                " must have the dtype of key (expected ", dtype_name(key.scalar_type()), ", got ",
                dtype_name(t->scalar_type()), "; kv_cache_dtype 'auto' stores key's dtype)");
  }
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor*>{"key", &key}, {"value", &value}}) {
    TORCH_CHECK(unit_last_stride(*t), op, ": ", name,
                " must have stride 1 along its last dimension (head_size), got "
                "strides ",
                t->strides());
  }
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong || slot_mapping.scalar_type() == at::kInt, op,
              ": slot_mapping must be int64 or int32, got ",
              dtype_name(slot_mapping.scalar_type()));
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) <= key.size(0), op,
              ": slot_mapping must have shape [num_tokens] with num_tokens <= key.size(0) = ",
              key.size(0), ", got ", slot_mapping.sizes());
  TORCH_CHECK(slot_mapping.is_contiguous(), op, ": slot_mapping must be contiguous, got strides ",
              slot_mapping.strides());

  attention::CacheWriteParams p;
  p.dtype = dtype_of(key);
  p.num_tokens = slot_mapping.size(0);
  p.num_heads = heads;
  p.head_size = head_size;
  p.key = key.const_data_ptr();
  p.key_token_stride = key.stride(0);
  p.key_head_stride = key.stride(1);
  p.value = value.const_data_ptr();
  p.value_token_stride = value.stride(0);
  p.value_head_stride = value.stride(1);
  p.slot_mapping = slot_mapping.const_data_ptr();
  p.slot_mapping_int64 = slot_mapping.scalar_type() == at::kLong;
  if (flash) {
    for (const auto& [name, t] :
         {std::pair<const char*, const at::Tensor*>{"key_cache", &key_cache},
          {"value_cache", &value_cache}}) {
      TORCH_CHECK(t->dim() == 4 && t->size(2) == heads && t->size(3) == head_size, op, ": ", name,
                  " must have shape [num_blocks, block_size, num_heads = ", heads,
                  ", head_size = ", head_size, "], got ", t->sizes());
      TORCH_CHECK(unit_last_stride(*t), op, ": ", name,
                  " must have stride 1 along its last dimension (head_size), got strides ",
                  t->strides());
    }
    TORCH_CHECK(
        value_cache.size(0) == key_cache.size(0) && value_cache.size(1) == key_cache.size(1), op,
        ": value_cache must have the shape of key_cache ", key_cache.sizes(), ", got ",
        value_cache.sizes());
    p.num_blocks = key_cache.size(0);
    p.block_size = key_cache.size(1);
    for (auto [layout, t] :
         {std::pair<attention::CacheLayout*, at::Tensor*>{&p.key_cache, &key_cache},
          {&p.value_cache, &value_cache}}) {
      layout->data = t->mutable_data_ptr();
      layout->block_stride = t->stride(0);
      layout->row_stride = t->stride(1);
      layout->head_stride = t->stride(2);
      layout->x = head_size;
      layout->d_inner_stride = 1;
    }
  } else {
    TORCH_CHECK(key_cache.dim() == 5 && key_cache.size(1) == heads && key_cache.size(4) > 0 &&
                    key_cache.size(2) * key_cache.size(4) == head_size,
                op, ": key_cache must have shape [num_blocks, num_heads = ", heads,
                ", head_size / x, block_size, x] ", "with head_size = ", head_size,
                " a multiple of x, got ", key_cache.sizes());
    TORCH_CHECK(value_cache.dim() == 4 && value_cache.size(0) == key_cache.size(0) &&
                    value_cache.size(1) == heads && value_cache.size(2) == head_size &&
                    value_cache.size(3) == key_cache.size(3),
                op, ": value_cache must have shape [num_blocks = ", key_cache.size(0),
                ", num_heads = ", heads, ", head_size = ", head_size,
                ", block_size = ", key_cache.size(3), "], got ", value_cache.sizes());
    p.num_blocks = key_cache.size(0);
    p.block_size = key_cache.size(3);
    p.key_cache = layout_of(key_cache, true);
    attention::CacheLayout& vc = p.value_cache;
    vc.data = value_cache.mutable_data_ptr();
    vc.block_stride = value_cache.stride(0);
    vc.head_stride = value_cache.stride(1);
    vc.row_stride = value_cache.stride(3);
    vc.x = head_size;
    vc.d_outer_stride = 0;
    vc.d_inner_stride = value_cache.stride(2);
  }
  check_no_overlap(op, {{"key_cache", &key_cache}, {"value_cache", &value_cache}},
                   {{"key", &key}, {"value", &value}, {"slot_mapping", &slot_mapping}});
  if (p.num_tokens == 0 || heads == 0 || head_size == 0) return;
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    on_cpu(op, [&] { attention::cpu::cache_write(p); });
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(device);
    p.errors = take_device_errors(op, device);
    p.error_op = error_op_of(op);
    const cudaError_t err =
        attention::cuda::cache_write(p, c10::cuda::getCurrentCUDAStream(device.index()));
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return;
  }
#endif
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

}  // namespace

// ---- the ops of torch_binding.h ----

void attn_fwd(at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const OptTensor& lse, const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
              const OptTensor& seqused_k, const OptTensor& block_table,
              const OptTensor& kv_batch_idx, const OptTensor& leftpad_k,
              const OptTensor& alibi_slopes, int64_t max_seqlen_q, int64_t max_seqlen_k,
              double softmax_scale, double softcap, bool causal, int64_t window_left,
              int64_t window_right, int64_t num_splits, std::optional<bool> enable_pdl) {
  AttentionCall c;
  c.pdl_request = pdl::request_of(enable_pdl);
  c.op = "attn_fwd";
  c.out = out;
  c.q = q;
  c.k = k;
  c.v = v;
  c.lse = lse;
  c.cu_seqlens_q = cu_seqlens_q;
  c.cu_seqlens_k = cu_seqlens_k;
  c.seqused_k = seqused_k;
  c.block_table = block_table;
  c.kv_batch_idx = kv_batch_idx;
  c.leftpad_k = leftpad_k;
  c.alibi_slopes = alibi_slopes;
  c.max_seqlen_q = max_seqlen_q;
  c.max_seqlen_k = max_seqlen_k;
  c.softmax_scale = softmax_scale;
  c.softcap = softcap;
  c.causal = causal;
  c.window_left = window_left;
  c.window_right = window_right;
  c.num_splits = num_splits;
  run_attention(c);
}

namespace {

// The kernels' params of a checked backward call: the forward's, then dout and the gradients
// (dense: [batch, rows, heads, D]; varlen: [rows, heads, D]).
attention::AttnBwdParams backward_params(const AttentionCall& c, const Geometry& g,
                                         const at::Tensor& dout, at::Tensor& dq, at::Tensor& dk,
                                         at::Tensor& dv) {
  attention::AttnBwdParams p;
  p.fwd = make_params(c, g);
  const auto strides = [&](const at::Tensor& t, bool varlen, int64_t& batch, int64_t& row,
                           int64_t& head) {
    if (varlen) {
      row = stride(t, 0);
      head = stride(t, 1);
    } else {
      batch = stride(t, 0);
      row = stride(t, 1);
      head = stride(t, 2);
    }
  };
  p.dout = dout.const_data_ptr();
  strides(dout, g.varlen_q, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  p.dq = dq.mutable_data_ptr();
  strides(dq, g.varlen_q, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  p.dk = dk.mutable_data_ptr();
  strides(dk, g.varlen_k, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  p.dv = dv.mutable_data_ptr();
  strides(dv, g.varlen_k, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  return p;
}

#if defined(CUDA_KERNEL)
// The CUDA backward (attention_cuda.h, attn_bwd). Inputs that are not 16-byte aligned are read
// through contiguous copies and such gradients written through temporaries, as in the forward;
// a head dim that is not a multiple of 8 runs on zero-padded copies (pad_head_dim), its
// gradients through padded temporaries (the padded columns' gradients are zero and dropped).
// lse is made contiguous, since the rowsum(dout * out) workspace takes its layout.
// deterministic = false (flash-attn's default) runs the Hopper backward where it takes the call
// (attn_bwd_hopper_workspace; ATTENTION_HOPPER=0 turns it off as for the forward), else adds dQ
// with atomics into a zeroed fp32 workspace of [q_rows, heads_q, head_dim] during the dK/dV pass
// (AttnBwdParams::dq_accum), which spares a dQ pass that recomputes S and dP; true runs that pass,
// without a workspace, for the same bits on every run.
void run_backward_cuda(const AttentionCall& c, const Geometry& g, const at::Tensor& dout,
                       at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, bool deterministic) {
  const at::Device device = c.q.device();
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  Geometry gk = g;
  gk.head_dim = kernel_head_dim(g.head_dim);
  const bool padded = gk.head_dim != g.head_dim;
  const auto readable = [&](const at::Tensor& t) {
    if (padded) return pad_head_dim(t, gk.head_dim);
    return aligned16(t) ? t : t.contiguous();
  };
  // Varlen rows outside every sequence are not written: a temporary starts as the caller's zeros.
  const auto writable = [&](const at::Tensor& t, bool varlen) {
    if (!padded && aligned16(t)) return t;
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes.back() = gk.head_dim;
    return varlen ? at::zeros(sizes, t.options()) : at::empty(sizes, t.options());
  };
  AttentionCall a = c;
  a.q = readable(c.q);
  a.k = readable(c.k);
  a.v = readable(c.v);
  a.out = readable(c.out);
  a.lse = c.lse->contiguous();
  const at::Tensor d_out = readable(dout);
  at::Tensor dq_w = writable(dq, g.varlen_q), dk_w = writable(dk, g.varlen_k),
             dv_w = writable(dv, g.varlen_k);
  attention::AttnBwdParams p = backward_params(a, gk, d_out, dq_w, dk_w, dv_w);
  const at::TensorOptions fp32 = c.q.options().dtype(at::kFloat);
  const int64_t hopper_floats = deterministic ? 0 : attention::cuda::attn_bwd_hopper_workspace(p);
  cudaError_t err = cudaSuccess;
  if (hopper_floats > 0) {
    at::Tensor workspace = at::empty({hopper_floats}, fp32);
    err = attention::cuda::attn_bwd_hopper(p, workspace.mutable_data_ptr<float>(), stream);
  } else {
    at::Tensor dsum = at::empty_like(*a.lse);
    const int64_t q_rows = g.varlen_q ? g.total_q : g.batch * g.seqlen_q;
    at::Tensor dq_accum;
    if (!deterministic) {
      dq_accum = at::zeros({q_rows, g.heads_q, gk.head_dim}, fp32);
      p.dq_accum = dq_accum.mutable_data_ptr<float>();
    }
    err = attention::cuda::attn_bwd(p, dsum.mutable_data_ptr<float>(), q_rows, stream);
  }
  TORCH_CHECK(err == cudaSuccess, c.op, ": CUDA launch failed: ", cudaGetErrorString(err));
  for (auto [given, written] :
       {std::pair<at::Tensor*, at::Tensor*>{&dq, &dq_w}, {&dk, &dk_w}, {&dv, &dv_w}}) {
    if (!given->is_same(*written))
      given->copy_(padded ? written->narrow(-1, 0, g.head_dim) : *written);
  }
}
#endif

// attn_bwd under the name of the op that runs it (attn_bwd, bwd, varlen_bwd). `deterministic`
// picks the CUDA schedule (run_backward_cuda); the CPU backward is deterministic either way.
void run_backward(const char* op, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                  const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                  const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
                  const OptTensor& alibi_slopes, int64_t max_seqlen_q, int64_t max_seqlen_k,
                  double softmax_scale, double softcap, bool causal, int64_t window_left,
                  int64_t window_right, bool deterministic) {
  // The forward's call, checked as attn_fwd checks it (lse required here), then each gradient
  // against the tensor it is the gradient of.
  AttentionCall c;
  c.op = op;
  c.out = out;
  c.q = q;
  c.k = k;
  c.v = v;
  c.lse = lse;
  c.cu_seqlens_q = cu_seqlens_q;
  c.cu_seqlens_k = cu_seqlens_k;
  c.alibi_slopes = alibi_slopes;
  c.max_seqlen_q = max_seqlen_q;
  c.max_seqlen_k = max_seqlen_k;
  c.softmax_scale = softmax_scale;
  c.softcap = softcap;
  c.causal = causal;
  c.window_left = window_left;
  c.window_right = window_right;
  const Geometry g = check(c);
  for (const auto& [name, grad, of, of_name] :
       {std::tuple<const char*, const at::Tensor*, const at::Tensor*, const char*>{"dout", &dout,
                                                                                   &out, "out"},
        {"dq", &dq, &q, "q"},
        {"dk", &dk, &k, "k"},
        {"dv", &dv, &v, "v"}}) {
    check_device(c, name, *grad);
    check_dtype_of(c.op, name, *grad, of_name, *of);
    TORCH_CHECK(grad->sizes() == of->sizes(), c.op, ": ", name, " must have the shape of ", of_name,
                " ", of->sizes(), ", got ", grad->sizes());
    TORCH_CHECK(grad->size(-1) <= 1 || grad->stride(-1) == 1, c.op, ": ", name,
                " must have unit stride along the head dim, got strides ", grad->strides());
  }
  check_no_overlap(
      c.op, {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}},
      {{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}});
#if defined(CUDA_KERNEL)
  if (q.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t max_head_dim = attention::cuda::attn_bwd_max_head_dim();
    TORCH_CHECK_NOT_IMPLEMENTED(
        g.head_dim <= max_head_dim, c.op, ": the CUDA backward takes head dims up to ",
        max_head_dim, " on this device (its tiles must fit a block's shared memory), got ",
        g.head_dim);
  }
#endif
  // The kernels write every row of a dense batch. Packed (varlen) rows past the last sequence,
  // and every row when there is nothing to compute, get zero gradients here.
  const bool nothing = g.batch == 0 || g.total_q == 0 || g.heads_q == 0 || c.k.numel() == 0;
  if (nothing || g.varlen_q) dq.zero_();
  if (nothing || g.varlen_k) {
    dk.zero_();
    dv.zero_();
  }
  if (nothing) return;
#if defined(CUDA_KERNEL)
  if (q.is_cuda()) {
    run_backward_cuda(c, g, dout, dq, dk, dv, deterministic);
    return;
  }
#endif
#if defined(CPU_KERNEL)
  if (q.is_cpu()) {
    (void)deterministic;  // no atomics on the CPU: the same bits either way
    const attention::AttnBwdParams p = backward_params(c, g, dout, dq, dk, dv);
    on_cpu(c.op, [&] { attention::cpu::attn_bwd(p); });
    return;
  }
#endif
  TORCH_CHECK_NOT_IMPLEMENTED(false, c.op, ": no backward for device ", q.device(),
                              " in this build");
}

// The low-level backwards' dq / dk / dv: the given tensor, else a new one like its input.
at::Tensor given_or_new_grad(const OptTensor& given, const at::Tensor& of) {
  return given.has_value() && given->defined() ? *given : at::empty_like(of);
}

// flash-attn's softmax_d: rowsum(dout * out) in float32, laid out as softmax_lse ([B, H, S_q] or
// [H, total_q]; flash-attn's CUDA pads the last dim, this does not).
at::Tensor softmax_d_of(const at::Tensor& dout, const at::Tensor& out) {
  return dout.to(at::kFloat).mul(out.to(at::kFloat)).sum(-1).transpose(-1, -2).contiguous();
}

void check_backward_dropout(const char* op, double p_dropout) {
  TORCH_CHECK_NOT_IMPLEMENTED(p_dropout == 0.0, op, ": dropout (p_dropout = ", p_dropout,
                              ") is not implemented, in the forward either (use p_dropout = 0)");
}

}  // namespace

void attn_bwd(at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, const at::Tensor& dout,
              const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
              const at::Tensor& lse, const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
              const OptTensor& alibi_slopes, int64_t max_seqlen_q, int64_t max_seqlen_k,
              double softmax_scale, double softcap, bool causal, int64_t window_left,
              int64_t window_right, bool deterministic) {
  run_backward("attn_bwd", dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
               alibi_slopes, max_seqlen_q, max_seqlen_k, softmax_scale, softcap, causal,
               window_left, window_right, deterministic);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& softmax_lse, const OptTensor& dq_,
    const OptTensor& dk_, const OptTensor& dv_, const OptTensor& alibi_slopes, double p_dropout,
    double softmax_scale, bool is_causal, int64_t window_size_left, int64_t window_size_right,
    double softcap, bool deterministic, const std::optional<at::Generator>& gen,
    const OptTensor& rng_state) {
  (void)gen;
  (void)rng_state;
  constexpr const char* op = "bwd";
  check_backward_dropout(op, p_dropout);
  TORCH_CHECK(q.dim() == 4, op, ": q must have shape [batch, seqlen_q, num_heads, head_dim], got ",
              q.sizes());
  at::Tensor dq = given_or_new_grad(dq_, q), dk = given_or_new_grad(dk_, k),
             dv = given_or_new_grad(dv_, v);
  run_backward(op, dq, dk, dv, dout, q, k, v, out, softmax_lse, std::nullopt, std::nullopt,
               alibi_slopes, 0, 0, softmax_scale, softcap, is_causal, window_size_left,
               window_size_right, deterministic);
  return std::make_tuple(dq, dk, dv, softmax_d_of(dout, out));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& softmax_lse, const OptTensor& dq_,
    const OptTensor& dk_, const OptTensor& dv_, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, const OptTensor& alibi_slopes, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double p_dropout, double softmax_scale, bool zero_tensors, bool is_causal,
    int64_t window_size_left, int64_t window_size_right, double softcap, bool deterministic,
    const std::optional<at::Generator>& gen, const OptTensor& rng_state) {
  (void)gen;
  (void)rng_state;
  (void)zero_tensors;  // rows outside every sequence get zero gradients regardless
  constexpr const char* op = "varlen_bwd";
  check_backward_dropout(op, p_dropout);
  TORCH_CHECK(q.dim() == 3, op, ": q must have shape [total_q, num_heads, head_dim], got ",
              q.sizes());
  at::Tensor dq = given_or_new_grad(dq_, q), dk = given_or_new_grad(dk_, k),
             dv = given_or_new_grad(dv_, v);
  run_backward(op, dq, dk, dv, dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
               alibi_slopes, max_seqlen_q, max_seqlen_k, softmax_scale, softcap, is_causal,
               window_size_left, window_size_right, deterministic);
  return std::make_tuple(dq, dk, dv, softmax_d_of(dout, out));
}

std::tuple<at::Tensor, at::Tensor> fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& out,
    const OptTensor& alibi_slopes, double p_dropout, double softmax_scale, bool is_causal,
    int64_t window_size_left, int64_t window_size_right, double softcap, bool return_softmax,
    const std::optional<at::Generator>& gen, std::optional<bool> enable_pdl) {
  (void)gen;
  constexpr const char* op = "fwd";
  check_no_dropout(op, p_dropout, return_softmax);
  TORCH_CHECK(q.dim() == 4, op, ": q must have shape [batch, seqlen_q, num_heads, head_dim], got ",
              q.sizes());
  AttentionCall c;
  c.pdl_request = pdl::request_of(enable_pdl);
  c.op = op;
  c.q = q;
  c.k = k;
  c.v = v;
  c.out = given_or_new_out(out, q);
  at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  c.lse = lse;
  c.alibi_slopes = alibi_slopes;
  c.softmax_scale = softmax_scale;
  c.softcap = softcap;
  c.causal = is_causal;
  c.window_left = window_size_left;
  c.window_right = window_size_right;
  run_attention(c);
  return std::make_tuple(c.out, lse);
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& out,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, const OptTensor& seqused_k,
    const OptTensor& leftpad_k, const OptTensor& block_table, const OptTensor& alibi_slopes,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double p_dropout, double softmax_scale,
    bool zero_tensors, bool is_causal, int64_t window_size_left, int64_t window_size_right,
    double softcap, bool return_softmax, const std::optional<at::Generator>& gen,
    std::optional<bool> enable_pdl) {
  (void)gen;
  constexpr const char* op = "varlen_fwd";
  check_no_dropout(op, p_dropout, return_softmax);
  TORCH_CHECK(q.dim() == 3, op, ": q must have shape [total_q, num_heads, head_dim], got ",
              q.sizes());
  AttentionCall c;
  c.pdl_request = pdl::request_of(enable_pdl);
  c.op = op;
  c.q = q;
  c.k = k;
  c.v = v;
  c.out = given_or_new_out(out, q);
  at::Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
  c.lse = lse;
  c.cu_seqlens_q = cu_seqlens_q;
  c.seqused_k = seqused_k;
  c.leftpad_k = leftpad_k;
  c.alibi_slopes = alibi_slopes;
  c.max_seqlen_q = max_seqlen_q;
  c.max_seqlen_k = max_seqlen_k;
  c.softmax_scale = softmax_scale;
  c.softcap = softcap;
  c.causal = is_causal;
  c.window_left = window_size_left;
  c.window_right = window_size_right;
  c.block_table = block_table;
  c.cu_seqlens_k = cu_seqlens_k;  // with block_table: the key lengths (unless seqused_k)
  if (zero_tensors) {
    c.before_launch = [&c, &lse] {
      c.out.zero_();
      lse.fill_(-std::numeric_limits<float>::infinity());
    };
  }
  run_attention(c);
  return std::make_tuple(c.out, lse);
}

std::tuple<at::Tensor, at::Tensor> fwd_kvcache(
    const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache, const OptTensor& k,
    const OptTensor& v, const OptTensor& cache_seqlens, const OptTensor& rotary_cos,
    const OptTensor& rotary_sin, const OptTensor& cache_batch_idx, const OptTensor& cache_leftpad,
    const OptTensor& block_table, const OptTensor& alibi_slopes, const OptTensor& out,
    double softmax_scale, bool is_causal, int64_t window_size_left, int64_t window_size_right,
    double softcap, bool rotary_interleaved, int64_t num_splits, std::optional<bool> enable_pdl) {
  constexpr const char* op = "fwd_kvcache";
  TORCH_CHECK(q.dim() == 4, op, ": q must have shape [batch, seqlen_q, num_heads, head_dim], got ",
              q.sizes());
  const int64_t batch = q.size(0);
  const bool paged = present(block_table);
  const bool new_kv = present(k);
  const bool rotary = present(rotary_cos);
  TORCH_CHECK(new_kv == present(v), op,
              ": k and v must be given together (new keys and values to append)");
  TORCH_CHECK(rotary == present(rotary_sin), op,
              ": rotary_cos and rotary_sin must be given together");
  TORCH_CHECK(!new_kv || present(cache_seqlens), op,
              ": cache_seqlens is required with new k / v (the cache row where they are appended)");
  TORCH_CHECK(!rotary || new_kv, op,
              ": rotary_cos / rotary_sin need new k / v to append (flash-attn's rule)");
  TORCH_CHECK(k_cache.dim() == 4, op, ": k_cache must have shape ",
              paged ? "[num_blocks, block_size, num_heads_k, head_dim]"
                    : "[batch_cache, seqlen_cache, num_heads_k, head_dim]",
              ", got ", k_cache.sizes());
  const auto names = [&]() {
    Names n;
    n.k = "k_cache";
    n.v = "v_cache";
    n.lse = "softmax_lse";
    n.seqused_k = "cache_seqlens";
    n.kv_batch_idx = "cache_batch_idx";
    n.leftpad_k = "cache_leftpad";
    return n;
  }();
  if (present(cache_seqlens)) {
    const at::Tensor& s = *cache_seqlens;
    check_device_of(op, "cache_seqlens", s, "q", q);
    TORCH_CHECK(
        s.scalar_type() == at::kInt && s.dim() == 1 && s.size(0) == batch && s.is_contiguous(), op,
        ": cache_seqlens must be a contiguous int32 tensor of shape [batch = ", batch, "], got ",
        dtype_name(s.scalar_type()), " ", s.sizes());
  }
  int64_t seqlen_new = 0;
  if (new_kv) {
    for (const auto& [name, t] :
         {std::pair<const char*, const at::Tensor*>{"k", &*k}, {"v", &*v}}) {
      check_device_of(op, name, *t, "q", q);
      check_dtype_of(op, name, *t, "q", q);
      TORCH_CHECK(t->dim() == 4 && t->size(0) == batch && t->size(2) == k_cache.size(2) &&
                      t->size(3) == k_cache.size(3),
                  op, ": ", name, " must have shape [batch = ", batch,
                  ", seqlen_new, num_heads_k = ", k_cache.size(2), ", head_dim = ", k_cache.size(3),
                  "], got ", t->sizes());
      TORCH_CHECK(unit_last_stride(*t), op, ": ", name,
                  " must have stride 1 along its last dimension, got strides ", t->strides());
    }
    TORCH_CHECK(v->size(1) == k->size(1), op, ": v must have the shape of k ", k->sizes(), ", got ",
                v->sizes());
    seqlen_new = k->size(1);
  }

  // The attention over the caches (their own checks name k_cache, v_cache, cache_batch_idx, ...).
  AttentionCall c;
  c.op = op;
  c.pdl_request = pdl::request_of(enable_pdl);
  c.names = names;
  c.k = k_cache;
  c.v = v_cache;
  c.block_table = block_table;
  c.kv_batch_idx = cache_batch_idx;
  c.leftpad_k = cache_leftpad;
  c.alibi_slopes = alibi_slopes;
  c.softmax_scale = softmax_scale;
  c.softcap = softcap;
  c.causal = is_causal;
  c.window_left = window_size_left;
  c.window_right = window_size_right;
  c.num_splits = num_splits;
  c.q = q;
  c.out = given_or_new_out(out, q);
  at::Tensor lse = at::empty({batch, q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  c.lse = lse;
  if (present(cache_seqlens)) {
    // Keys per sequence: [cache_leftpad, cache_seqlens + seqlen_new) (flash-attn's absolute rows).
    // Each tensor op here is a kernel launch on the decode path (about 1.5 us each in a CUDA graph
    // on an H200), so the common forms take none (cache_seqlens as it is) or one (int32 add).
    if (present(cache_leftpad)) {
      at::Tensor used =
          cache_seqlens->to(at::kLong).add(seqlen_new).sub(cache_leftpad->to(at::kLong));
      c.seqused_k = used.to(at::kInt);
    } else if (seqlen_new == 0) {
      c.seqused_k = *cache_seqlens;
    } else {
      c.seqused_k = cache_seqlens->add(seqlen_new);  // int32 (checked above)
    }
    c.names.seqused_note = present(cache_leftpad) ? " (cache_seqlens + new tokens - cache_leftpad)"
                                                  : " (cache_seqlens + new tokens)";
  }
  // Check everything (tensors of the attention call included) before anything is written.
  AttentionCall probe = c;
  const Geometry g = check(probe);
  at::Tensor q_attn = q;
  if (new_kv) {
    // The append writes k_cache and v_cache before the attention reads them.
    std::vector<Named> read = {{"q", &q}, {"k", &*k}, {"v", &*v}};
    add_present(read, {{"cache_seqlens", &cache_seqlens},
                       {"rotary_cos", &rotary_cos},
                       {"rotary_sin", &rotary_sin},
                       {"cache_batch_idx", &cache_batch_idx},
                       {"cache_leftpad", &cache_leftpad},
                       {"block_table", &block_table},
                       {"alibi_slopes", &alibi_slopes}});
    check_no_overlap(op, {{"k_cache", &k_cache}, {"v_cache", &v_cache}}, read);
  }

  if (new_kv) {
    attention::KvAppendParams a;
    a.dtype = dtype_of(q);
    a.batch = batch;
    a.heads_q = g.heads_q;
    a.heads_kv = g.heads_kv;
    a.head_dim = g.head_dim;
    a.seqlen_new = seqlen_new;
    a.k_new = k->const_data_ptr();
    a.k_new_batch_stride = k->stride(0);
    a.k_new_row_stride = k->stride(1);
    a.k_new_head_stride = k->stride(2);
    a.v_new = v->const_data_ptr();
    a.v_new_batch_stride = v->stride(0);
    a.v_new_row_stride = v->stride(1);
    a.v_new_head_stride = v->stride(2);
    a.k_cache = k_cache.mutable_data_ptr();
    a.k_cache_batch_stride = k_cache.stride(0);
    a.k_cache_row_stride = k_cache.stride(1);
    a.k_cache_head_stride = k_cache.stride(2);
    a.v_cache = v_cache.mutable_data_ptr();
    a.v_cache_batch_stride = v_cache.stride(0);
    a.v_cache_row_stride = v_cache.stride(1);
    a.v_cache_head_stride = v_cache.stride(2);
    a.cache_batch = g.batch_k;
    a.cache_seqlen = g.seqlen_k;
    a.cache_seqlens = cache_seqlens->const_data_ptr<int32_t>();
    if (present(cache_batch_idx)) a.kv_batch_idx = cache_batch_idx->const_data_ptr<int32_t>();
    if (paged) {
      a.block_table = block_table->const_data_ptr<int32_t>();
      a.block_table_batch_stride = block_table->stride(0);
      a.max_blocks = g.max_blocks;
      a.page_block_size = g.block_size;
      a.num_blocks = g.num_blocks;
    }
    if (rotary) {
      const at::Tensor& cos = *rotary_cos;
      const at::Tensor& sin = *rotary_sin;
      for (const auto& [name, t] :
           {std::pair<const char*, const at::Tensor*>{"rotary_cos", &cos}, {"rotary_sin", &sin}}) {
        check_device_of(op, name, *t, "q", q);
        TORCH_CHECK(t->scalar_type() == q.scalar_type() || t->scalar_type() == at::kFloat, op, ": ",
                    name, " must have the dtype of q (", dtype_name(q.scalar_type()),
                    ") or float32, got ", dtype_name(t->scalar_type()));
        TORCH_CHECK(
            t->dim() == 2 && t->size(1) > 0 && 2 * t->size(1) <= g.head_dim, op, ": ", name,
            " must have shape [seqlen_ro, rotary_dim / 2] with 0 < rotary_dim <= head_dim = ",
            g.head_dim, ", got ", t->sizes());
        TORCH_CHECK(unit_last_stride(*t), op, ": ", name,
                    " must have stride 1 along its last dimension, got strides ", t->strides());
      }
      TORCH_CHECK(sin.sizes() == cos.sizes() && sin.scalar_type() == cos.scalar_type(), op,
                  ": rotary_sin must have the shape and dtype of rotary_cos (", cos.sizes(), " ",
                  dtype_name(cos.scalar_type()), "), got ", sin.sizes(), " ",
                  dtype_name(sin.scalar_type()));
      q_attn = at::empty(q.sizes(), q.options());
      a.rotary_cos = cos.const_data_ptr();
      a.rotary_sin = sin.const_data_ptr();
      a.rotary_fp32 = cos.scalar_type() == at::kFloat && q.scalar_type() != at::kFloat;
      a.rotary_rows = cos.size(0);
      a.rotary_dim = 2 * cos.size(1);
      a.rotary_cos_row_stride = cos.stride(0);
      a.rotary_sin_row_stride = sin.stride(0);
      a.rotary_interleaved = rotary_interleaved;
      a.q = q.const_data_ptr();
      a.q_batch_stride = q.stride(0);
      a.q_row_stride = q.stride(1);
      a.q_head_stride = q.stride(2);
      a.q_out = q_attn.mutable_data_ptr();
      a.q_out_batch_stride = q_attn.stride(0);
      a.q_out_row_stride = q_attn.stride(1);
      a.q_out_head_stride = q_attn.stride(2);
      a.seqlen_q = q.size(1);
      // flash-attn: causal / local attention rotates query i at cache_seqlens + i, otherwise every
      // query token at cache_seqlens.
      a.q_positions_per_token = is_causal || window_size_left >= 0 || window_size_right >= 0;
    }
    const at::Device device = q.device();
    bool launched = false;
#if defined(CPU_KERNEL)
    if (device.is_cpu()) {
      on_cpu(op, [&] { attention::cpu::kv_append(a); });
      launched = true;
    }
#endif
#if defined(CUDA_KERNEL)
    if (device.is_cuda()) {
      const c10::cuda::CUDAGuard device_guard(device);
      a.errors = take_device_errors(op, device);
      a.error_op = DeviceErrorOp::kFwdKvcache;
      c.errors = a.errors;
      const cudaError_t err =
          attention::cuda::kv_append(a, c10::cuda::getCurrentCUDAStream(device.index()));
      TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
      launched = true;
    }
#endif
    TORCH_CHECK(launched, op, ": no implementation for device ", device, " in this build");
  }
  c.q = q_attn;
  run_attention(c);
  return std::make_tuple(c.out, lse);
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping,
                       const std::string& kv_cache_dtype, const OptTensor& k_scale,
                       const OptTensor& v_scale) {
  write_cache("reshape_and_cache", false, key, value, key_cache, value_cache, slot_mapping,
              kv_cache_dtype, k_scale, v_scale);
}

void reshape_and_cache_flash(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                             at::Tensor& value_cache, const at::Tensor& slot_mapping,
                             const std::string& kv_cache_dtype, const OptTensor& k_scale,
                             const OptTensor& v_scale) {
  write_cache("reshape_and_cache_flash", true, key, value, key_cache, value_cache, slot_mapping,
              kv_cache_dtype, k_scale, v_scale);
}

void check_kvcache_errors(int64_t device) {
  constexpr const char* op = "check_kvcache_errors";
  TORCH_CHECK(device >= 0, op, ": device must be a CUDA device index (>= 0), got ", device);
#if defined(CUDA_KERNEL)
  const int64_t count = c10::cuda::device_count();
  TORCH_CHECK(device < count, op, ": device must be a CUDA device index (< ", count, "), got ",
              device);
  const at::Device cuda(at::kCUDA, static_cast<c10::DeviceIndex>(device));
  const c10::cuda::CUDAGuard device_guard(cuda);
  const cudaError_t err = cudaDeviceSynchronize();
  TORCH_CHECK(err == cudaSuccess, op, ": synchronizing ", cuda,
              " failed: ", cudaGetErrorString(err));
  take_device_errors(op, cuda);
#else
  (void)device;  // the CPU checks every index value before it writes anything
#endif
}
