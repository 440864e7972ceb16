// A linear product's input and its shared fp8 codes; see linear_operand.h.
#include "nn/linear_operand.h"

#include "core/error.h"
#include "ops/fp8.h"

namespace zt::nn {

LinearOperand::LinearOperand(Tensor t) : t_(std::move(t)), shared_(std::make_shared<Shared>()) {}

Fp8Codes LinearOperand::codes(DType format) const {
  ZT_ASSERT(shared_ && t_.defined(), "LinearOperand::codes on an empty operand");
  Fp8Codes& c = shared_->codes;
  if (!c.q.defined()) {
    c.q = Tensor::empty(Shape{t_.numel()}, format, t_.device(), MemCategory::workspace);
    c.scale_inv = Tensor::empty(Shape{1}, DType::f32, t_.device(), MemCategory::workspace);
    ops::quantize_fp8(c.q.view(t_.shape()), c.scale_inv, t_);
  }
  ZT_ASSERT(c.q.dtype() == format, "an operand quantised as ", dtype_name(c.q.dtype()), " read as ",
            dtype_name(format));
  return Fp8Codes{c.q.view(t_.shape()), c.scale_inv};
}

LinearOperand LinearOperand::rows() const {
  LinearOperand r = *this;
  r.t_ = t_.view(Shape{t_.numel() / t_.size(-1), t_.size(-1)});
  return r;
}

}  // namespace zt::nn
