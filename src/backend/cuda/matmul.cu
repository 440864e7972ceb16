// CUDA matmul / linear kernels: cuBLASLt products plus the small kernels
// around them (beta/bias prefill and bf16 rounding, the db column sum, the
// GEMM throughput probe).
//
//   out_i = alpha * op(a_i) @ op(b_i) + beta * out_i + bias        (i over the batch)
//
// Row-major on column-major cuBLASLt: a row-major (M, N) matrix is the
// column-major (N, M) matrix out^T, and out^T = op(b)^T @ op(a)^T, so
// cuBLASLt's "A" is our b and its "B" our a, each keeping its own transpose
// flag, and D = out with leading dimension N; C = out, or a matrix of out's
// layout apart from it (linear_forward's residual).
//
// Compute: CUBLAS_COMPUTE_32F with f32 scale, i.e. true fp32 FMA for f32
// operands (never TF32) and f32 accumulation of bf16 operands on tensor cores.
// Split-K algorithms may only reduce their partial sums in the compute type
// (f32 workspace): the other schemes round partials to a bf16 out.
//
// Batches: a 2-D b shared by the batch with an untransposed a is one
//   (batch*M, K) product; other batches are strided batches (b's stride 0
//   when shared).
// Bias: the cuBLASLt BIAS epilogue when bias has out's dtype (the documented
//   bias type for non-fp8 products), is 16-byte aligned, and a cuBLASLt
//   algorithm accepts it (the heuristic also looks at the bias pointer's
//   alignment). Otherwise C = beta * out + bias is prefilled in f32 (in out
//   itself when out is f32, else in an f32 scratch rounded once into out
//   afterwards) and the product accumulates onto it with beta = 1: the CPU
//   backend's order, one rounding of out.
// DGELU: out = gelu'(pre) * (a @ b) through CUBLASLT_EPILOGUE_DGELU with pre
//   as the epilogue's auxiliary input (same layout as out): the GeLU backward
//   fused into the product that computes its incoming gradient.
// GELU_AUX: out = gelu(a @ b^T + bias), pre = a @ b^T + bias written as the
//   epilogue's auxiliary output (same layout as out): the GeLU forward
//   fused into the product that computes its input (ZT_CUDA_GELU_EPILOGUE=1).
// Plans: matmul descriptor, layouts and the heuristic's algorithm are made
//   once per (device, shape, transposes, dtypes, bias, alignments) key and
//   cached for the process (thread-safe). The algorithm is the heuristic's
//   first candidate, or under a MatmulCandidateScope the one it names (the
//   key holds the index), or when tuning the fastest of its ranked
//   candidates and cuBLAS's own GEMM on the plan's first call (matmul.h).
// cuBLAS's own GEMM (cublasGemmEx, one handle per device on the compute
//   stream, sharing the cuBLASLt workspace; math mode without reduced-precision
//   reductions, so split-K partials stay f32 as above) runs the products
//   without an epilogue that choose it: kCublasCandidate, ZT_CUDA_MATMUL_CUBLAS=1,
//   or a tuned plan where it was fastest.
//
// Linear backward (y = x W^T + b; dy (N, OC), x (N, C), W (OC, C)):
//   dx = dy @ W  (NN)      dW += dy^T @ x  (TN, beta 1)      db += colsum(dy)
// db: rows are cut into chunks whose size depends on the shape only; each
// chunk's column sums are f32 partials (fixed order inside the block), and the
// partials are added in chunk order to db with one rounding: the same bits
// every run, for every launch. With ZT_CUDA_BGRAD_EPILOGUE=1, db comes from
// dW's own product instead (the BGRADB epilogue: weight_gradient_with_bias).
#include "backend/cuda/matmul.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <cublas_v2.h>

#include "backend/cuda/colsum.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/matmul_plans.h"
#include "backend/cuda/runtime.h"
#include "core/determinism.h"
#include "core/env.h"

namespace zt::cuda {

namespace {

using bf16_t = __nv_bfloat16;

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::f8e5m2: return CUDA_R_8F_E5M2;
    default: break;
  }
  ZT_FAIL("internal: cuBLASLt matmul got dtype ", dtype_name(t));
}

// Calls f(T{}) with T = float, __nv_bfloat16 or __half for an f32 / bf16 /
// f16 dtype.
template <typename F>
void with_type(DType t, F&& f) {
  if (t == DType::bf16) {
    f(bf16_t{});
  } else if (t == DType::f16) {
    f(__half{});
  } else {
    f(float{});
  }
}

// The alignment in bytes cuBLASLt may assume of a matrix: the largest power of
// two (at most 256) dividing its address, its row stride and, in a batch, its
// batch stride.
uint32_t alignment_of(const void* p, int64_t batch, int64_t stride_elems, size_t elem_bytes, int64_t ld = 0) {
  uint64_t v = uint64_t(reinterpret_cast<uintptr_t>(p));
  if (batch > 1 && stride_elems != 0) v |= uint64_t(stride_elems) * elem_bytes;
  if (ld != 0) v |= uint64_t(ld) * elem_bytes;
  const uint64_t low = v & (~v + 1);  // lowest set bit; 0 for v = 0
  return low == 0 || low > 256 ? 256u : uint32_t(low);
}

// Everything the descriptors and the chosen algorithm depend on.
struct PlanKey {
  int device = 0;
  int64_t batch = 1, M = 0, N = 0, K = 0;  // row-major GemmDesc after folding the batch
  bool trans_a = false, trans_b = false;
  // Row strides of the stored (row-major) matrices and batch strides, in
  // elements (stride_b 0: b shared by the batch).
  int64_t lda = 0, ldb = 0, ldc = 0, stride_a = 0, stride_b = 0, stride_c = 0;
  // ab: our a's dtype; b_type: our b's, the same but in a scaled fp8 product
  // (e4m3 against e5m2 there).
  DType ab = DType::f32, b_type = DType::f32, out = DType::f32, bias = DType::f32;
  bool scaled = false;  // fp8 operands with per-tensor scales (A/B_SCALE_POINTER, set per launch)
  bool has_bias = false;
  bool dgelu = false;  // the DGELU epilogue, its input (pre) laid out like out (ld = ldc)
  bool gelu_aux = false;  // the GELU_AUX(_BIAS) epilogue, its output pre (the GeLU's input) laid out like out
  bool bgrad = false;  // the BGRADB epilogue: the bias pointer receives a's column sums (f32 out only)
  bool separate_c = false;  // beta scales another matrix of out's layout (a residual), not out itself
  // beta != 0: the heuristic never sees beta, but the library may refuse an
  // algorithm at launch for it (BGRADB accumulating into dW), so the choice
  // and its timing are kept apart for overwriting and accumulating calls.
  bool accumulate = false;
  uint32_t align_a = 0, align_b = 0, align_out = 0, align_bias = 0, align_aux = 0;
  int candidate = 0;  // which of the heuristic's ranked algorithms (MatmulCandidateScope)
  uint64_t workspace_bytes = 0;  // the heuristic's workspace limit: 0 the device's (MatmulWorkspaceScope)
  bool tune = false;             // the plan times its candidates (tuning_on)

  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ull + (h >> 29); };
    mix(uint64_t(k.device));
    mix(uint64_t(k.batch));
    mix(uint64_t(k.M));
    mix(uint64_t(k.N));
    mix(uint64_t(k.K));
    mix(uint64_t(k.trans_a) | uint64_t(k.trans_b) << 1 | uint64_t(k.has_bias) << 3 | uint64_t(k.dgelu) << 4 |
        uint64_t(k.bgrad) << 5 | uint64_t(k.separate_c) << 6 | uint64_t(k.accumulate) << 7 |
        uint64_t(k.gelu_aux) << 8 | uint64_t(k.scaled) << 9);
    for (int64_t v : {k.lda, k.ldb, k.ldc, k.stride_a, k.stride_b, k.stride_c}) mix(uint64_t(v));
    mix(uint64_t(k.ab) | uint64_t(k.out) << 8 | uint64_t(k.bias) << 16 | uint64_t(k.b_type) << 24);
    mix(uint64_t(k.align_a) | uint64_t(k.align_b) << 16 | uint64_t(k.align_out) << 32 | uint64_t(k.align_bias) << 48);
    mix(uint64_t(k.align_aux) | uint64_t(k.candidate) << 32 | uint64_t(k.tune) << 62);
    mix(k.workspace_bytes);
    return size_t(h);
  }
};

// Descriptors and algorithm of one cached product; never destroyed (they
// live as long as the process, like the cuBLASLt handles).
struct Plan {
  cublasLtHandle_t handle = nullptr;  // of the key's device
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lay_a = nullptr;  // cuBLASLt's A: our b
  cublasLtMatrixLayout_t lay_b = nullptr;  // cuBLASLt's B: our a
  cublasLtMatrixLayout_t lay_c = nullptr;  // C and D: out^T, (N, M) column-major
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // the heuristic returned the key's candidate
  int offered = 0;     // how many candidates it returned
  // A tuning plan (tuning_on): the heuristic's ranked candidates, timed with
  // cuBLAS's GEMM on the plan's first call (once), the fastest becoming
  // `algo` (or use_cublas).
  cublasLtMatmulAlgo_t ranked[kMatmulCandidates] = {};
  int ranked_at[kMatmulCandidates] = {};  // each one's place in the heuristic's list (its candidate number)
  int num_ranked = 0;
  bool use_cublas = false;  // tuning found cuBLAS's own GEMM fastest (a plain product only)
  std::once_flag tuned;
  std::mutex pointer_mu;  // the bias and aux pointers live in `op`: set them and launch under this lock
};

// A product cuBLAS's own GEMM can run: no epilogue, C is out (cuBLAS's
// GEMM has no D apart from C) and no fp8 scales. Any other product falls
// back where cuBLASLt refuses it.
bool epilogue_free(const PlanKey& k) {
  return !k.has_bias && !k.dgelu && !k.gelu_aux && !k.bgrad && !k.separate_c && !k.scaled;
}

std::string describe(const PlanKey& k) {
  return zt::detail::concat("batch ", k.batch, " M ", k.M, " N ", k.N, " K ", k.K, k.trans_a ? " trans_a" : "",
                        k.trans_b ? " trans_b" : "", " ld ", k.lda, "/", k.ldb, "/", k.ldc, " strides ", k.stride_a,
                        "/", k.stride_b, "/", k.stride_c, ", ", dtype_name(k.ab),
                        k.scaled ? zt::detail::concat(" x ", dtype_name(k.b_type), " scaled") : "", " -> ",
                        dtype_name(k.out), k.has_bias ? zt::detail::concat(", ", dtype_name(k.bias), " bias epilogue") : "",
                        k.dgelu ? ", dgelu epilogue" : "", k.gelu_aux ? ", gelu_aux epilogue" : "",
                        k.bgrad ? ", bgradb epilogue" : "",
                        k.separate_c ? ", C apart from out" : "", k.accumulate ? ", beta != 0" : "",
                        ", alignments a ",
                        k.align_a, " b ", k.align_b, " out ",
                        k.align_out, " bias ", k.align_bias, " aux ", k.align_aux,
                        k.candidate > 0 ? zt::detail::concat(", candidate ", k.candidate) : "",
                        k.workspace_bytes > 0 ? zt::detail::concat(", workspace ", k.workspace_bytes, " B") : "");
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  ZT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    ZT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    ZT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

// Whether a new plan times its candidates (matmul.h): ZT_CUDA_MATMUL_TUNE
// when set, else while determinism is off (core/determinism.h).
bool tuning_on() {
  static const std::optional<int64_t> forced =
      env_whole_number("ZT_CUDA_MATMUL_TUNE", 0,
                       "1: each product keeps the fastest of cuBLASLt's ranked algorithms on its first call; 0: the "
                       "first; unset: 1 while train.deterministic is false");
  return forced ? *forced > 0 : !deterministic();
}

// Whether products without an epilogue run through cuBLAS's own GEMM when
// not tuning (ZT_CUDA_MATMUL_CUBLAS=1; matmul.h says why).
bool cublas_by_default() {
  static const bool on =
      env_switch("ZT_CUDA_MATMUL_CUBLAS",
                 "1: products without an epilogue run through cuBLAS's own GEMM (cublasGemmEx, its heuristic's "
                 "choice) instead of cuBLASLt's first ranked algorithm; 0 or unset: cuBLASLt");
  return on;
}

// A cuBLAS handle of one device: on its compute stream, reductions in f32
// (no reduced-precision split-K), no atomics (cuBLAS's default). Its calls
// are serialised: a handle's workspace is set per call, and cuBLAS handles
// are not for concurrent use.
struct CublasHandle {
  cublasHandle_t handle = nullptr;
  std::mutex mu;
};

CublasHandle& cublas_for(Device device) {
  static std::mutex mu;
  static auto* handles = new std::unordered_map<int, std::unique_ptr<CublasHandle>>();  // never freed, like cuBLASLt's
  cudaStream_t stream = compute_stream(device);  // also makes the device current for cublasCreate
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<CublasHandle>& slot = (*handles)[device.index];
  if (!slot) {
    auto c = std::make_unique<CublasHandle>();
    ZT_CUBLAS_CHECK(cublasCreate(&c->handle));
    ZT_CUBLAS_CHECK(cublasSetStream(c->handle, stream));  // before the workspace: it resets the workspace
    ZT_CUBLAS_CHECK(cublasSetMathMode(
        c->handle, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    slot = std::move(c);
  }
  return *slot;
}

// out = alpha * op(a) @ op(b) + beta * out for a plain key (no epilogue)
// through cuBLAS's own GEMM, with the same column-major mapping as cuBLASLt
// (its A is our b) and `workspace` as its workspace.
std::atomic<int64_t> g_cublas_launches{0};
std::atomic<int64_t> g_prefilled_launches{0};  // prefilled_matmul_launches (matmul.h)
cublasStatus_t cublas_gemm(const PlanKey& k, const void* a, const void* b, void* out, float alpha, float beta,
                           void* workspace, size_t workspace_bytes, Device device) {
  ZT_ASSERT(epilogue_free(k), "cublas_gemm: cuBLAS's GEMM has no epilogue");
  CublasHandle& c = cublas_for(device);
  std::lock_guard<std::mutex> lock(c.mu);
  ZT_CUBLAS_CHECK(cublasSetWorkspace(c.handle, workspace, workspace_bytes));
  const cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our b
  const cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t ab = lt_type(k.ab), ct = lt_type(k.out);
  ++g_cublas_launches;
  if (k.batch == 1)
    return cublasGemmEx_64(c.handle, op_a, op_b, k.N, k.M, k.K, &alpha, b, ab, k.ldb, a, ab, k.lda, &beta, out, ct,
                           k.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return cublasGemmStridedBatchedEx_64(c.handle, op_a, op_b, k.N, k.M, k.K, &alpha, b, ab, k.ldb, k.stride_b, a, ab,
                                       k.lda, k.stride_a, &beta, out, ct, k.ldc, k.stride_c, k.batch,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// The tuned choices file (ZT_CUDA_MATMUL_PLANS; matmul_plans.h), or null
// when unset: read once per process.
MatmulPlanFile* plan_file() {
  static MatmulPlanFile* const file = [] {
    const char* path = std::getenv("ZT_CUDA_MATMUL_PLANS");
    return path && *path ? new MatmulPlanFile(path) : nullptr;  // never freed
  }();
  return file;
}

// A product's name in the plans file: the GPU, the cuBLASLt version and
// describe's product (the key less its device index, candidate and tuning).
std::string product_name(const PlanKey& key) {
  static std::mutex mu;
  static auto* gpu_names = new std::unordered_map<int, std::string>();  // never freed
  std::string gpu;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = gpu_names->find(key.device);
    if (it == gpu_names->end()) it = gpu_names->emplace(key.device, device_info(key.device).name).first;
    gpu = it->second;
  }
  PlanKey k = key;
  k.candidate = 0;
  k.tune = false;
  // The heuristic's list depends on the workspace it may use: a run with
  // another ZT_CUDA_CUBLAS_WORKSPACE_MIB must not take this run's "lt n".
  if (k.workspace_bytes == 0) k.workspace_bytes = cublaslt_workspace_bytes();
  return zt::detail::concat(gpu, " | cuBLASLt ", cublasLtGetVersion(), " | ", describe(k));
}

// The choice the plans file records for an untuned, unscoped product
// (looked up once per key; g_replayed_plans counts the keys it named).
std::atomic<int64_t> g_replayed_plans{0};
std::optional<MatmulChoice> recorded_choice(const PlanKey& k) {
  MatmulPlanFile* file = plan_file();
  if (file == nullptr) return std::nullopt;
  static std::mutex mu;
  static auto* found = new std::unordered_map<PlanKey, std::optional<MatmulChoice>, PlanKeyHash>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  auto it = found->find(k);
  if (it == found->end()) {
    it = found->emplace(k, file->find(product_name(k))).first;
    if (it->second) ++g_replayed_plans;
  }
  return it->second;
}

// The algorithm of this thread's last product (last_matmul_algorithm).
struct LastAlgorithm {
  bool any = false, cublas = false;
  cublasLtMatmulAlgo_t algo{};
};
thread_local LastAlgorithm t_last;

// Builds the descriptors of `k` and asks the heuristic for its ranked
// algorithms that fit the workspace and the alignments, taking the key's
// candidate: the first, unless a MatmulCandidateScope names another (all of
// them, to time, when tuning). `bias` is a pointer with the key's bias
// alignment, `aux` one with its aux alignment: the heuristic reads them from
// the descriptor.
std::unique_ptr<Plan> make_plan(const PlanKey& k, const void* bias, const void* aux, const void* a_scale,
                                const void* b_scale) {
  auto p = std::make_unique<Plan>();
  p->handle = cublaslt_handle(Device::cuda(k.device));
  ZT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
  const int32_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // BIAS adds the bias vector to every row of out; BGRADB writes our a's
  // column sums there instead (the sums over k of cuBLASLt's B, one per
  // column of D).
  if (k.has_bias || k.bgrad) {
    const uint32_t epi = k.bgrad ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = lt_type(k.bias);
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    ZT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (k.dgelu || k.gelu_aux) {
    // GELU_AUX_BIAS adds the bias (set above) before the GeLU, aux = the sum.
    const uint32_t epi = k.dgelu          ? CUBLASLT_EPILOGUE_DGELU
                         : k.has_bias     ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                          : CUBLASLT_EPILOGUE_GELU_AUX;
    const int32_t aux_type = lt_type(k.out);
    const int64_t aux_ld = k.ldc;
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    ZT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    ZT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                   sizeof(aux_type)));
  }
  if (k.scaled) {  // cuBLASLt's A is our b: its scale is b's
    ZT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    ZT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  }
  const cudaDataType_t ab = lt_type(k.ab), bt = lt_type(k.b_type), out = lt_type(k.out);
  // Stored shapes, column-major: b (K, N) row-major is (N, K) with its row
  // stride as ld; b (N, K) is (K, N). Likewise a (M, K) is (K, M).
  p->lay_a = k.trans_b ? make_layout(bt, k.K, k.N, k.ldb, k.batch, k.stride_b)
                       : make_layout(bt, k.N, k.K, k.ldb, k.batch, k.stride_b);
  p->lay_b = k.trans_a ? make_layout(ab, k.M, k.K, k.lda, k.batch, k.stride_a)
                       : make_layout(ab, k.K, k.M, k.lda, k.batch, k.stride_a);
  p->lay_c = make_layout(out, k.N, k.M, k.ldc, k.batch, k.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = k.workspace_bytes > 0 ? k.workspace_bytes : cublaslt_workspace_bytes();
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // no split-K partials rounded to out's dtype
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                       sizeof(reduction)));
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_b,
                                                       sizeof(k.align_b)));
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.align_a,
                                                       sizeof(k.align_a)));
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_out,
                                                       sizeof(k.align_out)));
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_out,
                                                       sizeof(k.align_out)));
  cublasLtMatmulHeuristicResult_t results[kMatmulCandidates] = {};
  const bool tune = k.tune;
  int returned = 0;
  // Always the whole list, tuned or not: a recorded candidate n is then the
  // n-th of the same list its tuning run timed (nothing documents that the
  // first n + 1 of a shorter request are the same algorithms).
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(p->handle, p->op, p->lay_a, p->lay_b, p->lay_c, p->lay_c,
                                                            pref, kMatmulCandidates, results, &returned);
  ZT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  // NOT_SUPPORTED: no algorithm. Anything else names a descriptor we built
  // wrong for a plain product; one with an epilogue or a C of its own may
  // also read as "parameters in an impossible configuration" (INVALID_VALUE),
  // a refusal that falls back (as its launch's would).
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && epilogue_free(k))
    throw InternalError(
        zt::detail::concat("cuBLASLt's heuristic failed (", cublasGetStatusName(st), ") for the matmul ", describe(k)));
  p->offered = st == CUBLAS_STATUS_SUCCESS ? returned : 0;
  // The heuristic sees one layout for C and D, not that they are apart: a
  // separate C keeps only the algorithms that may write D elsewhere (in
  // their order, so candidate n is the n-th of the same list in every run).
  if (k.separate_c) {
    int kept = 0;
    for (int i = 0; i < p->offered; ++i) {
      int32_t out_of_place = 0;
      size_t written = 0;
      if (results[i].state == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoCapGetAttribute(&results[i].algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT,
                                            &out_of_place, sizeof(out_of_place), &written) == CUBLAS_STATUS_SUCCESS &&
          out_of_place != 0)
        results[kept++] = results[i];
    }
    p->offered = kept;
  }
  ZT_CHECK(k.candidate >= 0 && k.candidate < kMatmulCandidates, "matmul: cuBLASLt candidate ", k.candidate,
           " is outside 0..", kMatmulCandidates - 1);
  const cublasLtMatmulHeuristicResult_t& chosen = results[k.candidate];
  p->found = p->offered > k.candidate && chosen.state == CUBLAS_STATUS_SUCCESS;
  if (p->found) p->algo = chosen.algo;
  if (tune && p->found)
    for (int i = 0; i < p->offered; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) {
        p->ranked_at[p->num_ranked] = i;
        p->ranked[p->num_ranked++] = results[i].algo;
      }
  return p;
}

// The candidate products take on this thread (MatmulCandidateScope), and the
// workspace they plan for and use (MatmulWorkspaceScope; null: the device's).
thread_local int t_candidate = -1;  // -1: no scope (the first, tuned, or cuBLAS's by the switches)
thread_local void* t_workspace = nullptr;
thread_local uint64_t t_workspace_bytes = 0;

// Tuning (tuning_on): sets p.algo, or p.use_cublas, to the fastest of p's
// ranked candidates and (epilogue-free products) cuBLAS's own GEMM on this
// call's operands. launch(option, dst) runs the call's product into dst with
// p.ranked[option], or cuBLAS's GEMM for option = p.num_ranked. Each option
// runs once to warm up, then kTimedLaunches times between two marks; one that
// fails to launch is passed over. The timing launches write `out` itself when
// beta = 0 or C is apart from it (the call's own launch overwrites it next),
// else a scratch of out's size (workspace, freed at once): they must not add
// into out.
constexpr int kTimedLaunches = 5;
std::atomic<int64_t> g_tuned_plans{0};
template <typename Launch>
void keep_fastest(Plan& p, const PlanKey& k, void* out, float beta, Device device, Launch&& launch) {
  Tensor scratch;
  void* dst = out;
  if (beta != 0.0f && !k.separate_c) {
    const int64_t elems = (k.batch - 1) * k.stride_c + (k.M - 1) * k.ldc + k.N;
    const int64_t words = (elems * int64_t(dtype_size(k.out)) + 3) / 4;
    scratch = Tensor::empty(Shape{words}, DType::f32, device, MemCategory::workspace);
    dst = scratch.data_ptr();
  }
  float best = std::numeric_limits<float>::infinity();
  int chosen = -1;
  EventTimer timer(device);
  const int options = p.num_ranked + (epilogue_free(k) ? 1 : 0);
  for (int i = 0; i < options; ++i) {
    if (launch(i, dst) != CUBLAS_STATUS_SUCCESS) continue;
    timer.start();
    for (int r = 0; r < kTimedLaunches; ++r) ZT_CUBLAS_CHECK(launch(i, dst));
    const float ms = timer.stop_ms();
    if (ms < best) {
      best = ms;
      chosen = i;
      p.use_cublas = i == p.num_ranked;
      if (!p.use_cublas) p.algo = p.ranked[i];
    }
  }
  ++g_tuned_plans;
  // For the deterministic runs that read the plans file.
  if (MatmulPlanFile* file = plan_file(); file != nullptr && chosen >= 0)
    file->record(product_name(k), chosen == p.num_ranked ? MatmulChoice{.cublas = true}
                                                          : MatmulChoice{.candidate = p.ranked_at[chosen]});
}

// The cached plan of `k` (made on first use).
Plan& plan_for(const PlanKey& k, const void* bias, const void* aux, const void* a_scale, const void* b_scale) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(k);
  if (it == cache->end()) it = cache->emplace(k, make_plan(k, bias, aux, a_scale, b_scale)).first;
  return *it->second;
}

// Runs the cached plan of k: out = alpha * op(a) @ op(b) + beta * out (+ bias
// through the epilogue; times gelu'(aux) with the DGELU one; beta * c instead
// of beta * out when k.separate_c; op(a) and op(b) times the f32 scales at
// a_scale and b_scale (device) when k.scaled). Returns false, having launched nothing,
// when an epilogue or a separate c is asked for and no algorithm applies it
// (none offered, or the offered one refused at launch); throws when a plain
// product finds no algorithm.
bool launch_plan(const PlanKey& key, const void* a, const void* b, void* out, const void* bias, const void* aux,
                 float alpha_in, float beta_in, Device device, const void* c = nullptr, const void* a_scale = nullptr,
                 const void* b_scale = nullptr) {
  PlanKey k = key;
  const bool scoped = t_candidate >= 0;  // exactly the scope's candidate: no tuning, no switch
  k.candidate = scoped ? t_candidate : 0;
  k.workspace_bytes = t_workspace_bytes;
  k.tune = !scoped && tuning_on();
  k.accumulate = beta_in != 0.0f;
  const float alpha = alpha_in, beta = beta_in;
  void* const workspace = t_workspace != nullptr ? t_workspace : cublaslt_workspace(device);
  const size_t workspace_bytes = t_workspace != nullptr ? size_t(t_workspace_bytes) : cublaslt_workspace_bytes();
  const bool plain = epilogue_free(k);
  // What a tuning run recorded for it (ZT_CUDA_MATMUL_PLANS), else the switch.
  const std::optional<MatmulChoice> recorded = scoped || k.tune ? std::nullopt : recorded_choice(k);
  ZT_CHECK(!recorded || !recorded->cublas || plain, "matmul plans ", plan_file() ? plan_file()->path() : "",
           " name cuBLAS's GEMM for ", product_name(k), ", which has an epilogue cuBLAS's GEMM cannot apply; delete ",
           "that line and a tuning run records it again");
  if (recorded && !recorded->cublas) k.candidate = recorded->candidate;
  if (k.candidate == kCublasCandidate || (recorded && recorded->cublas) ||
      (plain && !scoped && !k.tune && !recorded && cublas_by_default())) {
    ZT_CHECK(plain, "matmul: cuBLAS's own GEMM applies no epilogue, so there is no candidate ", kCublasCandidate,
             " (cuBLAS's GEMM) for ", describe(k), "; MatmulCandidateScope's cuBLASLt candidates are 0..",
             kMatmulCandidates - 1);
    ZT_CUBLAS_CHECK(cublas_gemm(k, a, b, out, alpha, beta, workspace, workspace_bytes, device));
    t_last = LastAlgorithm{.any = true, .cublas = true};
    return true;
  }
  Plan& p = plan_for(k, bias, aux, a_scale, b_scale);
  // A candidate asked for by index ends a sweep where the list ends, rather
  // than falling back to another product.
  ZT_CHECK(p.found || k.candidate == 0 || !recorded, "matmul plans ", plan_file() ? plan_file()->path() : "",
           " name cuBLASLt's candidate ", k.candidate, " for ", product_name(k), ", but it offers ", p.offered,
           "; delete that line and a tuning run records it again");
  ZT_CHECK(p.found || k.candidate == 0, "matmul: cuBLASLt offers ", p.offered, " candidate(s) for ", describe(k),
           ", so there is no candidate ", k.candidate, " (MatmulCandidateScope counts from 0)");
  if (!p.found) {
    if (!plain) return false;
    throw InternalError(zt::detail::concat("cuBLASLt found no algorithm for the matmul ", describe(k)));
  }
  cudaStream_t stream = compute_stream(device);
  // C = D = dst, or C the separate matrix (D = dst: tuning's scratch or out).
  auto launch_with = [&](const cublasLtMatmulAlgo_t& algo, void* dst) {
    const void* src = k.separate_c ? c : dst;
    return cublasLtMatmul(p.handle, p.op, &alpha, b, p.lay_a, a, p.lay_b, &beta, src, p.lay_c, dst, p.lay_c, &algo,
                          workspace, workspace_bytes, stream);
  };
  // Tuning's options: the ranked algorithms, then cuBLAS's GEMM (plain
  // products). A cuBLAS handle that cannot be made (its few buffers on a
  // full GPU) only takes cuBLAS's GEMM out of the running.
  auto launch_option = [&](int option, void* dst) {
    if (option < p.num_ranked) return launch_with(p.ranked[option], dst);
    try {
      return cublas_gemm(k, a, b, dst, alpha, beta, workspace, workspace_bytes, device);
    } catch (const std::exception&) {  // InternalError from a failed cuBLAS call
      return CUBLAS_STATUS_NOT_INITIALIZED;
    }
  };
  // False when the library turns an epilogue's algorithm away at launch
  // (launching nothing): the heuristic does not see beta, and an epilogue
  // (BGRADB accumulating into dW) may be offered, then refused with beta = 1.
  auto launch = [&] {
    if (p.num_ranked > 1 || (p.num_ranked == 1 && plain))
      std::call_once(p.tuned, [&] { keep_fastest(p, k, out, beta, device, launch_option); });
    if (p.use_cublas) {
      ZT_CUBLAS_CHECK(cublas_gemm(k, a, b, out, alpha, beta, workspace, workspace_bytes, device));
      t_last = LastAlgorithm{.any = true, .cublas = true};
      return true;
    }
    const cublasStatus_t status = launch_with(p.algo, out);
    // A refusal may also read as parameters "in an impossible configuration".
    if ((status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) && !plain) return false;
    ZT_CUBLAS_CHECK(status);
    t_last = LastAlgorithm{.any = true, .cublas = false, .algo = p.algo};
    return true;
  };
  if (plain) return launch();
  std::lock_guard<std::mutex> lock(p.pointer_mu);
  if (k.has_bias || k.bgrad)
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (k.dgelu || k.gelu_aux)
    ZT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  if (k.scaled) {
    ZT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    ZT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  }
  return launch();
}

// The plan key of a GemmDesc (d already folded) over contiguous matrices;
// c the matrix beta scales when apart from out (of out's layout), else null.
PlanKey contiguous_key(const GemmDesc& d, DType ab, const void* a, const void* b, DType out_type, void* out,
                       const void* bias, DType bias_type, Device device, const void* c = nullptr) {
  PlanKey k;
  k.device = device.index;
  k.batch = d.batch, k.M = d.M, k.N = d.N, k.K = d.K;
  k.trans_a = d.trans_a, k.trans_b = d.trans_b;
  // Contiguous matrices: row strides from the stored shapes.
  k.lda = d.trans_a ? d.M : d.K;
  k.ldb = d.trans_b ? d.K : d.N;
  k.ldc = d.N;
  k.stride_a = d.M * d.K;
  k.stride_b = d.b_shared && d.batch > 1 ? 0 : d.K * d.N;
  k.stride_c = d.M * d.N;
  k.ab = ab, k.b_type = ab, k.out = out_type;
  k.has_bias = bias != nullptr;
  k.bias = k.has_bias ? bias_type : out_type;
  const size_t es = dtype_size(ab);
  k.align_a = alignment_of(a, d.batch, k.stride_a, es);
  k.align_b = alignment_of(b, d.batch, k.stride_b, es);
  k.align_out = alignment_of(out, d.batch, k.stride_c, dtype_size(out_type));
  k.separate_c = c != nullptr;
  // One alignment preference covers C and D: the smaller of the two.
  if (k.separate_c) k.align_out = std::min(k.align_out, alignment_of(c, d.batch, k.stride_c, dtype_size(out_type)));
  k.align_bias = k.has_bias ? alignment_of(bias, 1, 0, 0) : 0;
  return k;
}

// launch_plan for a GemmDesc (d already folded) over contiguous matrices.
bool lt_matmul(const GemmDesc& d, DType ab, const void* a, const void* b, DType out_type, void* out,
               const void* bias, DType bias_type, Device device, const void* c = nullptr) {
  const PlanKey k = contiguous_key(d, ab, a, b, out_type, out, bias, bias_type, device, c);
  return launch_plan(k, a, b, out, bias, nullptr, d.alpha, d.beta, device, c);
}

// dst[i] = beta * prev[i] + bias[i % cols] in f32, rounded once to TDst.
// beta = 0 never reads prev; bias may be null. dst may be prev (elementwise).
template <typename TDst, typename TPrev, typename TBias>
__global__ void beta_bias_kernel(TDst* dst, const TPrev* prev, const TBias* bias, float beta, int64_t n,
                                 int64_t cols) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float v = beta == 0.0f ? 0.0f : beta * to_f32(prev[i]);
    if (bias) v += to_f32(bias[i % cols]);
    dst[i] = from_f32<TDst>(v);
  }
}

// dst (n elements, rows of `cols`) = beta * prev + bias (bias undefined: none).
void beta_bias(void* dst, DType dst_type, const void* prev, DType prev_type, const void* bias, DType bias_type,
               float beta, int64_t n, int64_t cols, Device device) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const unsigned grid = grid_for(n, kThreads, device);
  cudaStream_t s = compute_stream(device);
  with_type(dst_type, [&](auto dst_tag) {
    using TDst = decltype(dst_tag);
    with_type(prev_type, [&](auto prev_tag) {
      using TPrev = decltype(prev_tag);
      with_type(bias_type, [&](auto bias_tag) {
        using TBias = decltype(bias_tag);
        beta_bias_kernel<TDst, TPrev, TBias><<<grid, kThreads, 0, s>>>(
            static_cast<TDst*>(dst), static_cast<const TPrev*>(prev), static_cast<const TBias*>(bias), beta, n,
            cols);
        ZT_CUDA_CHECK_LAUNCH("beta_bias_kernel");
      });
    });
  });
}

// out = beta * prev + bias + a product, summed in f32 and rounded once: an
// f32 C prefilled with beta * prev + bias (prev of out's dtype; bias null:
// none), the product accumulated onto it by accumulate(dst) (beta 1, C = D =
// dst; false: it could not run), then rounded into out. An f32 out is its
// own accumulator unless keep_out (out untouched where the product cannot
// run). Counts the launches (prefilled_matmul_launches).
template <typename Accumulate>
bool prefilled_product(const Tensor& out, const void* prev, const void* bias, DType bias_type, float beta, int64_t n,
                       int64_t cols, bool keep_out, Accumulate&& accumulate) {
  const Device device = out.device();
  const bool in_place = out.dtype() == DType::f32 && !keep_out;
  const Tensor acc32 = in_place ? Tensor() : Tensor::empty(Shape{n}, DType::f32, device, MemCategory::workspace);
  void* const dst = in_place ? out.data_ptr() : acc32.data_ptr();
  beta_bias(dst, DType::f32, prev, out.dtype(), bias, bias_type, beta, n, cols, device);
  if (!accumulate(dst)) return false;
  ++g_prefilled_launches;
  if (!in_place) beta_bias(out.data_ptr(), out.dtype(), dst, DType::f32, nullptr, DType::f32, 1.0f, n, cols, device);
  return true;
}

// ---- GEMM throughput probe ----

// p[i] = uniform in [-0.5, 0.5) from a hash of (seed, i), rounded to bf16.
__global__ void fill_uniform_bf16_kernel(bf16_t* p, int64_t n, uint64_t seed) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = __float2bfloat16_rn(float(z >> 40) * 0x1p-24f - 0.5f);
  }
}

}  // namespace

MatmulCandidateScope::MatmulCandidateScope(int candidate) : previous_(t_candidate) {
  ZT_CHECK(candidate >= 0 && candidate <= kCublasCandidate, "MatmulCandidateScope: candidate ", candidate,
           " is outside 0..", kCublasCandidate, " (cuBLASLt's ranked 0..", kMatmulCandidates - 1, ", then ",
           kCublasCandidate, " cuBLAS's own GEMM)");
  t_candidate = candidate;
}
MatmulCandidateScope::~MatmulCandidateScope() { t_candidate = previous_; }

MatmulWorkspaceScope::MatmulWorkspaceScope(const Tensor& workspace)
    : previous_(t_workspace), previous_bytes_(t_workspace_bytes) {
  ZT_CHECK(workspace.device().is_cuda() && workspace.nbytes() > 0 &&
               reinterpret_cast<uintptr_t>(workspace.data_ptr()) % 256 == 0,
           "MatmulWorkspaceScope: the workspace must be a non-empty, 256-byte aligned GPU tensor");
  t_workspace = workspace.data_ptr();
  t_workspace_bytes = uint64_t(workspace.nbytes());
}
MatmulWorkspaceScope::~MatmulWorkspaceScope() {
  t_workspace = previous_;
  t_workspace_bytes = previous_bytes_;
}

int64_t tuned_matmul_plans() { return g_tuned_plans.load(); }
int64_t cublas_matmul_launches() { return g_cublas_launches.load(); }
int64_t prefilled_matmul_launches() { return g_prefilled_launches.load(); }
int64_t replayed_matmul_plans() { return g_replayed_plans.load(); }

std::string last_matmul_algorithm() {
  if (!t_last.any) return "";
  if (t_last.cublas) return "cublas";
  // Each attribute read into a zeroed 64-bit word at its own width (int32,
  // uint32 or uint16 in cublasLt.h; little-endian, so the low bytes).
  auto get = [](cublasLtMatmulAlgoConfigAttributes_t attr, size_t bytes) {
    uint64_t v = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&t_last.algo, attr, &v, bytes, &written) != CUBLAS_STATUS_SUCCESS)
      return std::string("?");
    return std::to_string(v);
  };
  return zt::detail::concat("algo ", get(CUBLASLT_ALGO_CONFIG_ID, 4), " tile ", get(CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
                            " stages ", get(CUBLASLT_ALGO_CONFIG_STAGES_ID, 4), " splitk ",
                            get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4), " reduction ",
                            get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4), " swizzle ",
                            get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 4), " cluster ",
                            get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2), " inner ",
                            get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, 2), " custom ",
                            get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4));
}

void strided_gemm(const StridedGemm& g, DType ab, const void* a, const void* b, DType out_type, void* out,
                  Device device) {
  if (g.batch == 0 || g.M == 0 || g.N == 0) return;
  ZT_ASSERT(g.K > 0, "strided_gemm: K must be > 0");
  PlanKey k;
  k.device = device.index;
  k.batch = g.batch, k.M = g.M, k.N = g.N, k.K = g.K;
  k.trans_a = g.trans_a, k.trans_b = g.trans_b;
  k.lda = g.lda, k.ldb = g.ldb, k.ldc = g.ldc;
  k.stride_a = g.stride_a, k.stride_b = g.stride_b, k.stride_c = g.stride_c;
  k.ab = ab, k.b_type = ab, k.out = out_type, k.bias = out_type;
  const size_t es = dtype_size(ab);
  k.align_a = alignment_of(a, g.batch, g.stride_a, es, g.lda);
  k.align_b = alignment_of(b, g.batch, g.stride_b, es, g.ldb);
  k.align_out = alignment_of(out, g.batch, g.stride_c, dtype_size(out_type), g.ldc);
  launch_plan(k, a, b, out, nullptr, nullptr, g.alpha, g.beta, device);
}

bool matmul_gelu_backward(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& pre) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (M == 0 || N == 0) return true;
  if (K == 0 || N % 8 != 0) return false;  // the epilogue's aux leading dimension must be a multiple of 8
  GemmDesc d;
  d.M = M, d.N = N, d.K = K;
  PlanKey k = contiguous_key(d, a.dtype(), a.data_ptr(), b.data_ptr(), out.dtype(), out.data_ptr(), nullptr,
                             out.dtype(), out.device());
  k.dgelu = true;
  k.align_aux = alignment_of(pre.data_ptr(), 1, 0, dtype_size(pre.dtype()), N);
  return launch_plan(k, a.data_ptr(), b.data_ptr(), out.data_ptr(), nullptr, pre.data_ptr(), 1.0f, 0.0f,
                     out.device());
}

bool gelu_epilogue_on() {
  static const bool on =
      env_switch("ZT_CUDA_GELU_EPILOGUE",
                 "1: GPT-2's GeLU runs inside the product before it (cuBLASLt's GELU_AUX epilogue); 0 or unset: a "
                 "pass of its own");
  return on;
}

bool linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t OC = w.size(0), C = w.size(1);
  if (OC == 0 || pre.numel() == 0) return true;
  const int64_t N = pre.numel() / OC;
  if (C == 0 || OC % 8 != 0) return false;  // the epilogue's aux leading dimension must be a multiple of 8
  if (x.dtype() != act.dtype()) return false;  // the aux output (pre) is D's dtype
  // A bias as matmul takes it into an epilogue: D's dtype, 16-byte aligned.
  if (b.defined() && (b.dtype() != act.dtype() || reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 != 0)) return false;
  GemmDesc d;
  d.M = N, d.N = OC, d.K = C, d.trans_b = true, d.b_shared = true;
  const void* bias = b.defined() ? b.data_ptr() : nullptr;
  PlanKey k = contiguous_key(d, x.dtype(), x.data_ptr(), w.data_ptr(), act.dtype(), act.data_ptr(), bias,
                             b.defined() ? b.dtype() : act.dtype(), act.device());
  k.gelu_aux = true;
  k.align_aux = alignment_of(pre.data_ptr(), 1, 0, dtype_size(pre.dtype()), OC);
  return launch_plan(k, x.data_ptr(), w.data_ptr(), act.data_ptr(), bias, pre.data_ptr(), 1.0f, 0.0f,
                     act.device());
}

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmDesc& desc,
            const Tensor& c) {
  GemmDesc d = desc;
  // A shared b with an untransposed a: the batch is just more rows of a.
  if (d.b_shared && !d.trans_a && d.batch > 1 && d.batch * d.M <= INT_MAX) {
    d.M *= d.batch;
    d.batch = 1;
  }
  if (d.batch == 0 || d.M == 0 || d.N == 0) return;
  ZT_CHECK(d.batch <= INT_MAX, "matmul: batch of ", d.batch, " products exceeds cuBLASLt's limit of ", INT_MAX);
  const Device device = out.device();
  const int64_t n = d.batch * d.M * d.N;
  const void* bias_p = bias.defined() ? bias.data_ptr() : nullptr;
  const DType bias_type = bias.defined() ? bias.dtype() : DType::f32;
  // The matrix beta scales: c, or out itself.
  const void* prev = c.defined() && d.beta != 0.0f ? c.data_ptr() : out.data_ptr();
  const void* c_apart = prev != out.data_ptr() ? prev : nullptr;
  if (d.K == 0) {  // empty reduction: out = beta * prev + bias
    if (d.beta != 1.0f || bias_p || c_apart)
      beta_bias(out.data_ptr(), out.dtype(), prev, out.dtype(), bias_p, bias_type, d.beta, n, d.N, device);
    return;
  }
  // The epilogue only for a 16-byte aligned bias: its loads are vectorised (the
  // heuristic should filter by the bias pointer, but we do not rely on it).
  const bool bias_aligned = reinterpret_cast<uintptr_t>(bias_p) % 16 == 0;
  if (!bias_p || (bias_type == out.dtype() && bias_aligned)) {
    if (lt_matmul(d, a.dtype(), a.data_ptr(), b.data_ptr(), out.dtype(), out.data_ptr(), bias_p, bias_type, device,
                  c_apart))
      return;
  }
  // Bias (or c) outside cuBLASLt: C = beta * prev + bias in f32, then C += alpha * op(a) @ op(b).
  GemmDesc acc = d;
  acc.beta = 1.0f;
  prefilled_product(out, prev, bias_p, bias_type, d.beta, n, d.N, /*keep_out=*/false, [&](void* dst) {
    return lt_matmul(acc, a.dtype(), a.data_ptr(), b.data_ptr(), DType::f32, dst, nullptr, DType::f32, device);
  });
}

namespace {
std::atomic<int64_t> g_fp8_launches{0};  // fp8_matmul_launches
}  // namespace

bool fp8_matmul(const Tensor& out, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                const Tensor& b_scale_inv, const Tensor& bias, const Tensor& c, float beta) {
  const int64_t K = a.size(-1), N = b.size(0), M = K > 0 ? a.numel() / K : 0;
  if (M == 0 || N == 0 || K == 0) return false;  // nothing for the tensor cores: the caller's path
  const Device device = out.device();
  // out (M, N) = a (M, K) @ b (N, K)^T: cuBLASLt's A is b with op T and its B
  // is a with op N - the "TN" layout, the only one Hopper's fp8 GEMM takes.
  GemmDesc d;
  d.M = M, d.N = N, d.K = K, d.trans_b = true;
  const void* sa = a_scale_inv.data_ptr();
  const void* sb = b_scale_inv.data_ptr();
  auto product = [&](void* dst, DType dst_type, const void* bias_p, const void* c_apart, float beta_of) {
    PlanKey k = contiguous_key(d, a.dtype(), a.data_ptr(), b.data_ptr(), dst_type, dst, bias_p, DType::bf16, device,
                               c_apart);
    k.b_type = b.dtype();
    k.scaled = true;
    const bool ran = launch_plan(k, a.data_ptr(), b.data_ptr(), dst, bias_p, nullptr, 1.0f, beta_of, device,
                                 c_apart, sa, sb);
    if (ran) ++g_fp8_launches;
    return ran;
  };
  const void* prev = c.defined() && beta != 0.0f ? c.data_ptr() : out.data_ptr();
  const void* c_apart = prev != out.data_ptr() ? prev : nullptr;
  // The bias epilogue of an fp8 product takes a bf16 bias (cuBLASLt's table
  // for fp8 with bf16 or f32 D), 16-byte aligned as matmul asks.
  const bool bias_epilogue = bias.defined() && bias.dtype() == DType::bf16 &&
                             reinterpret_cast<uintptr_t>(bias.data_ptr()) % 16 == 0;
  if ((!bias.defined() || bias_epilogue) &&
      product(out.data_ptr(), out.dtype(), bias.defined() ? bias.data_ptr() : nullptr, c_apart, beta))
    return true;
  if (!bias.defined() && c_apart == nullptr) return false;  // a plain product refused: no other form
  // C = beta * prev + bias in an f32 scratch (out is not written unless the
  // product runs), the product added onto it, rounded once into out.
  return prefilled_product(out, prev, bias.defined() ? bias.data_ptr() : nullptr,
                           bias.defined() ? bias.dtype() : DType::f32, beta, M * N, N, /*keep_out=*/true,
                           [&](void* dst) { return product(dst, DType::f32, nullptr, nullptr, 1.0f); });
}

int64_t fp8_matmul_launches() { return g_fp8_launches.load(); }

namespace {
// Whether linear_backward takes the bias gradient from the weight
// gradient's product (ZT_CUDA_BGRAD_EPILOGUE=1; matmul.h).
bool bgrad_epilogue_on() {
  static const bool on =
      env_switch("ZT_CUDA_BGRAD_EPILOGUE",
                 "1: a linear layer's bias gradient comes from its weight gradient's product (cuBLASLt's BGRADB "
                 "epilogue) instead of a column-sum pass over dy; 0 or unset: the column sums");
  return on;
}

// The 128 x 128 output tiles of an (OC, C) weight gradient, and whether they
// are too few to keep half of `sms` busy: the products row chunks are for.
int64_t wgrad_tiles(int64_t OC, int64_t C) { return ((OC + 127) / 128) * ((C + 127) / 128); }
bool wgrad_has_few_tiles(int64_t OC, int64_t C, int64_t sms) { return 2 * wgrad_tiles(OC, C) <= sms; }
}  // namespace

int64_t wgrad_chunks_for(int64_t OC, int64_t C, int64_t rows, int64_t sms) {
  if (!wgrad_has_few_tiles(OC, C, sms)) return 1;  // half the SMs busy or more: cuBLASLt's own choice
  if (rows >= kWgradOneProductRows) return 1;      // cuBLASLt splits the long reduction (measured)
  const int64_t tiles = wgrad_tiles(OC, C);
  const auto score = [&](int64_t chunks) {
    const int64_t ctas = tiles * chunks;
    const double occupancy = double(ctas) / double((ctas + sms - 1) / sms * sms);
    // The partials' bytes (written and read, 8 x chunks x OC x C) over the
    // product's FLOPs (2 x OC x C x rows), in time at kGemmFlopsPerCopyByte.
    const double partials = 4.0 * double(chunks) * kGemmFlopsPerCopyByte / double(rows);
    return occupancy / (1.0 + (chunks > 1 ? partials : 0.0));
  };
  // More chunks only for a clear gain: exact ties (GPT-2's 16 and 32 at
  // 131072 rows) keep the fewer, whatever the compiler's rounding.
  int64_t best = 1;
  for (int64_t chunks = 2; chunks <= kWgradMaxChunks; ++chunks)
    if (wgrad_chunks_usable(chunks, rows) && score(chunks) > score(best) * (1.0 + 1e-9)) best = chunks;
  return best;
}

bool wgrad_chunks_usable(int64_t chunks, int64_t rows) {
  return chunks == 1 ||
         (chunks > 1 && rows % chunks == 0 && (rows / chunks) % 8 == 0 && rows / chunks >= kWgradMinChunkRows);
}

namespace {

std::optional<int64_t> forced_wgrad_chunks() {
  static const std::optional<int64_t> forced =
      env_whole_number("ZT_CUDA_WGRAD_CHUNKS", 1, "row chunks of a weight gradient; 1: one product");
  return forced;
}

}  // namespace

void read_matmul_environment() {
  (void)tuning_on();
  (void)cublas_by_default();
  (void)plan_file();
  (void)gelu_epilogue_on();
  (void)bgrad_epilogue_on();
  (void)forced_wgrad_chunks();
  (void)cublaslt_workspace_bytes();
}

int64_t wgrad_row_chunks(int64_t OC, int64_t C, int64_t rows, Device device) {
  const std::optional<int64_t> forced = forced_wgrad_chunks();
  // Forced only where the rule would consider chunks: the LM head's dW in n
  // chunks would be n f32 copies of a (V, C) matrix.
  if (forced)
    return wgrad_has_few_tiles(OC, C, num_sms(device)) && wgrad_chunks_usable(*forced, rows) ? *forced : 1;
  return wgrad_chunks_for(OC, C, rows, num_sms(device));
}

int64_t linear_backward_workspace_bytes(int64_t OC, int64_t C, int64_t rows, bool bias, Device device) {
  const int64_t chunks = wgrad_row_chunks(OC, C, rows, device);
  const int64_t partials = chunks > 1 ? 4 * chunks * OC * C : 0;
  // The epilogue's f32 sums, or (no algorithm takes it) the column sums'.
  const int64_t epilogue = bias && chunks == 1 && bgrad_epilogue_on() ? 4 * OC : 0;
  return std::max({partials, bias ? colsum_workspace_bytes(rows, OC) : 0, epilogue});
}

bool weight_gradient_with_bias(const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                               bool overwrite) {
  const int64_t N = dy.size(0), OC = dy.size(1), C = x.size(1);
  if (dw.dtype() != DType::f32 || N == 0 || OC == 0 || C == 0) return false;
  const Device device = dw.device();
  // dw (OC, C) += dy^T (OC, N) @ x (N, C): cuBLASLt's B is dy, whose sums
  // over k = N are the BGRADB epilogue's, one per column of D = dw^T.
  GemmDesc d;
  d.M = OC, d.N = C, d.K = N, d.trans_a = true, d.beta = overwrite ? 0.0f : 1.0f;
  // The sums go straight into an f32 db that is overwritten, else into an f32
  // scratch added into db once (add_chunk_partials: db's dtype, one rounding).
  // (16-byte aligned, as matmul asks of a bias epilogue's pointer.)
  const bool direct = overwrite && db.dtype() == DType::f32 && reinterpret_cast<uintptr_t>(db.data_ptr()) % 16 == 0;
  const Tensor sums = direct ? db : Tensor::empty(Shape{OC}, DType::f32, device, MemCategory::workspace);
  PlanKey k = contiguous_key(d, dy.dtype(), dy.data_ptr(), x.data_ptr(), DType::f32, dw.data_ptr(), nullptr,
                             DType::f32, device);
  k.bgrad = true;
  k.bias = DType::f32;
  k.align_bias = alignment_of(sums.data_ptr(), 1, 0, 0);
  if (!launch_plan(k, dy.data_ptr(), x.data_ptr(), dw.data_ptr(), sums.data_ptr(), nullptr, 1.0f, d.beta, device))
    return false;
  if (!direct) add_chunk_partials(db, sums, 1, OC, overwrite);
  return true;
}

void weight_gradient(const Tensor& dw, const Tensor& dy, const Tensor& x, int64_t chunks, bool overwrite) {
  const int64_t N = dy.size(0), OC = dy.size(1), C = x.size(1);
  ZT_CHECK(wgrad_chunks_usable(chunks, N), "weight_gradient: ", chunks, " chunks of ", N,
           " rows are not equal, 8-row aligned chunks of at least ", kWgradMinChunkRows, " rows");
  if (chunks == 1) {  // dw (OC, C) += dy^T (OC, N) @ x (N, C)  (=, when overwriting)
    GemmDesc d;
    d.M = OC, d.N = C, d.K = N, d.trans_a = true, d.beta = overwrite ? 0.0f : 1.0f;
    return cuda::matmul(dw, dy, x, Tensor(), d);
  }
  // partial_i (OC, C) = dy_i^T x_i over row chunk i, one strided batch;
  // then dw += the partials in chunk order, rounded once.
  const int64_t rows = N / chunks;
  Tensor partials = Tensor::empty(Shape{chunks * OC * C}, DType::f32, dw.device(), MemCategory::workspace);
  StridedGemm g;
  g.M = OC, g.N = C, g.K = rows, g.batch = chunks, g.trans_a = true;
  g.lda = OC, g.ldb = C, g.ldc = C;
  g.stride_a = rows * OC, g.stride_b = rows * C, g.stride_c = OC * C;
  strided_gemm(g, dy.dtype(), dy.data_ptr(), x.data_ptr(), DType::f32, partials.data_ptr(), dw.device());
  add_chunk_partials(dw, partials, chunks, OC * C, overwrite);
}

void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, bool overwrite) {
  const int64_t N = dy.size(0), OC = dy.size(1), C = w.size(1);
  if (dx.defined()) {  // dx (N, C) = dy (N, OC) @ w (OC, C)
    GemmDesc d;
    d.M = N, d.N = C, d.K = OC;
    cuda::matmul(dx, dy, w, Tensor(), d);
  }
  const int64_t chunks = dw.defined() && N > 0 ? wgrad_row_chunks(OC, C, N, dw.device()) : 1;
  if (dw.defined() && db.defined() && chunks == 1 && bgrad_epilogue_on() &&
      weight_gradient_with_bias(dw, db, dy, x, overwrite))
    return;
  if (dw.defined()) weight_gradient(dw, dy, x, chunks, overwrite);
  if (db.defined()) colsum_accumulate(db, dy, N, OC, overwrite);
}

double measure_bf16_gemm_tflops(Device device) {
  constexpr int64_t kN = 8192;
  constexpr int kWarmup = 3, kRuns = 10;
  ensure_initialized(device);
  Tensor a = Tensor::empty(Shape{kN, kN}, DType::bf16, device, MemCategory::workspace);
  Tensor b = Tensor::empty(Shape{kN, kN}, DType::bf16, device, MemCategory::workspace);
  Tensor c = Tensor::empty(Shape{kN, kN}, DType::bf16, device, MemCategory::workspace);
  cudaStream_t s = compute_stream(device);
  constexpr int kThreads = 256;
  const unsigned grid = grid_for(kN * kN, kThreads, device);
  fill_uniform_bf16_kernel<<<grid, kThreads, 0, s>>>(static_cast<bf16_t*>(a.data_ptr()), kN * kN, 1);
  ZT_CUDA_CHECK_LAUNCH("fill_uniform_bf16_kernel");
  fill_uniform_bf16_kernel<<<grid, kThreads, 0, s>>>(static_cast<bf16_t*>(b.data_ptr()), kN * kN, 2);
  ZT_CUDA_CHECK_LAUNCH("fill_uniform_bf16_kernel");
  GemmDesc d;  // c = a @ b^T: the linear layer's layout
  d.M = d.N = d.K = kN;
  d.trans_b = true;
  for (int i = 0; i < kWarmup; ++i) cuda::matmul(c, a, b, Tensor(), d);
  EventTimer timer(device);
  std::vector<float> ms;
  for (int i = 0; i < kRuns; ++i) {
    timer.start();
    cuda::matmul(c, a, b, Tensor(), d);
    ms.push_back(timer.stop_ms());
  }
  std::sort(ms.begin(), ms.end());
  const double median_ms = 0.5 * (double(ms[kRuns / 2 - 1]) + double(ms[kRuns / 2]));
  return 2.0 * double(kN) * double(kN) * double(kN) / (median_ms * 1e-3) / 1e12;
}

}  // namespace zt::cuda
