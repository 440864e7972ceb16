// Token + position embedding: argument validation, then dispatch by device.
// Math and determinism: ops/embedding.h and backend/cpu/embedding.cpp.
#include <cstdint>

#include "ops/embedding.h"

#include "backend/cpu/embedding.h"
#include "ops/check.h"
#include "ops/op_profile.h"
#include "ops/device.h"
#if ZT_WITH_CUDA
#include "backend/cuda/embedding.h"
#endif

namespace zt::ops {

namespace {

// Every id in [0, V); read on the host before anything is written.
void check_token_ids(const char* op, const Tensor& tokens, int64_t V) {
  const int32_t* tok = tokens.data<int32_t>();
  const int64_t T = tokens.size(1), n = tokens.numel();
  for (int64_t i = 0; i < n; ++i)
    ZT_CHECK(tok[i] >= 0 && tok[i] < V, op, ": token id ", tok[i], " at (b=", i / T, ", t=", i % T,
             ") of 'tokens' ", tokens.shape().str(), " is outside [0, V) with V = ", V);
}

void check_positions(const char* op, const char* name, const Tensor& table, int64_t T, int64_t pos_offset) {
  ZT_CHECK(pos_offset >= 0 && pos_offset + T <= table.size(0), op, ": positions [", pos_offset, ", ",
           pos_offset + T, ") (pos_offset ", pos_offset, ", T ", T, ") do not fit in '", name, "' ",
           table.shape().str(), "; need 0 <= pos_offset and pos_offset + T <= ", table.size(0));
}

void check_slice(const char* op, const VocabSlice& slice, int64_t rows) {
  if (!slice.partial()) return;
  ZT_CHECK(slice.start >= 0 && slice.start <= slice.vocab && slice.vocab >= 1, op, ": vocabulary slice starting at ",
           slice.start, " of a vocabulary of ", slice.vocab, " ids is invalid (need 0 <= start <= vocab, vocab >= 1; ",
           rows, " rows held)");
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, VocabSlice slice) {
  const char* op = "embedding_forward";
  const OpScope scope(op, out);
  check_ndim(op, "tokens", tokens, 2);
  check_dtype(op, "tokens", tokens, {DType::i32});
  check_ndim(op, "wte", wte, 2);
  check_compute_dtype(op, "wte", wte);
  const int64_t B = tokens.size(0), T = tokens.size(1), V = wte.size(0), C = wte.size(1);
  if (wpe.defined()) {
    check_ndim(op, "wpe", wpe, 2);
    check_same_dtype(op, "wte", wte, "wpe", wpe);
    ZT_CHECK(wpe.size(1) == C, op, ": 'wpe' has shape ", wpe.shape().str(), " but its width must be C = ", C,
             " (the width of 'wte' ", wte.shape().str(), ")");
    check_positions(op, "wpe", wpe, T, pos_offset);
  }
  check_shape(op, "out", out, Shape{B, T, C});
  check_same_dtype(op, "wte", wte, "out", out);
  check_device(op, out.device(), {{"out", &out}, {"wte", &wte}, {"wpe", &wpe}});
  check_ids_device(op, "tokens", tokens, out.device());
  check_disjoint(op, "out", out, "wte", wte);
  check_disjoint(op, "out", out, "wpe", wpe);
  check_disjoint(op, "out", out, "tokens", tokens);
  check_slice(op, slice, V);
  const int64_t ids = slice.partial() ? slice.vocab : V;
#if ZT_WITH_CUDA
  if (use_cuda(op, out.device())) {
    // Validated on the host before any write; uploaded (no wait) when they came from the host.
    check_token_ids(op, on_device(tokens, Device::cpu(), MemCategory::workspace), ids);
    return cuda::embedding_forward(out, on_device(tokens, out.device(), MemCategory::workspace), wte, wpe,
                                   pos_offset, slice.start);
  }
#endif
  if (!out.device().is_cpu()) no_backend(op, out.device());
  check_token_ids(op, tokens, ids);
  cpu::embedding_forward(out, tokens, wte, wpe, pos_offset, slice.start, slice.partial());
}

void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t pos_offset, VocabSlice slice) {
  const char* op = "embedding_backward";
  const OpScope scope(op, dout);
  check_ndim(op, "dout", dout, 3);
  check_compute_dtype(op, "dout", dout);
  const int64_t B = dout.size(0), T = dout.size(1), C = dout.size(2);
  check_shape(op, "tokens", tokens, Shape{B, T});
  check_dtype(op, "tokens", tokens, {DType::i32});
  ZT_CHECK(B * T < (int64_t(1) << 31), op, ": B * T = ", B * T, " tokens is too many (limit 2^31)");
  if (dwte.defined()) {
    check_ndim(op, "dwte", dwte, 2);
    if (dout.dtype() == DType::f32)
      check_dtype(op, "dwte", dwte, {DType::f32});
    else
      check_dtype(op, "dwte", dwte, {DType::f32, dout.dtype()});
    ZT_CHECK(dwte.size(1) == C, op, ": 'dwte' has shape ", dwte.shape().str(), " but its width must be C = ", C,
             " (the width of 'dout' ", dout.shape().str(), ")");
  }
  if (dwpe.defined()) {
    check_ndim(op, "dwpe", dwpe, 2);
    if (dout.dtype() == DType::f32)
      check_dtype(op, "dwpe", dwpe, {DType::f32});
    else
      check_dtype(op, "dwpe", dwpe, {DType::f32, dout.dtype()});
    ZT_CHECK(dwpe.size(1) == C, op, ": 'dwpe' has shape ", dwpe.shape().str(), " but its width must be C = ", C,
             " (the width of 'dout' ", dout.shape().str(), ")");
    check_positions(op, "dwpe", dwpe, T, pos_offset);
  }
  check_device(op, dout.device(), {{"dout", &dout}, {"dwte", &dwte}, {"dwpe", &dwpe}});
  check_ids_device(op, "tokens", tokens, dout.device());
  check_disjoint(op, "dwte", dwte, "dwpe", dwpe);
  check_disjoint(op, "dwte", dwte, "dout", dout);
  check_disjoint(op, "dwpe", dwpe, "dout", dout);
  check_disjoint(op, "dwte", dwte, "tokens", tokens);
  check_disjoint(op, "dwpe", dwpe, "tokens", tokens);
  if (dwte.defined()) check_slice(op, slice, dwte.size(0));
#if ZT_WITH_CUDA
  if (use_cuda(op, dout.device())) {
    const Tensor host_tokens = on_device(tokens, Device::cpu(), MemCategory::workspace);  // grouped by id here
    if (dwte.defined()) check_token_ids(op, host_tokens, slice.partial() ? slice.vocab : dwte.size(0));
    return cuda::embedding_backward(dwte, dwpe, dout, host_tokens, pos_offset, slice.start);
  }
#endif
  if (!dout.device().is_cpu()) no_backend(op, dout.device());
  if (dwte.defined()) check_token_ids(op, tokens, slice.partial() ? slice.vocab : dwte.size(0));
  cpu::embedding_backward(dwte, dwpe, dout, tokens, pos_offset, slice.start, slice.partial());
}

}  // namespace zt::ops
