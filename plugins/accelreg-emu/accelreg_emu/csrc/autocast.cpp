// Autocast on the emulated device: torch.autocast(<device type>) casts as it does on CUDA.
//
// torch registers autocast kernels for its in-tree devices only; an out-of-tree backend brings
// its own under its autocast dispatch key (AutocastPrivateUse1, or AutocastHPU for the hpu
// variant), and torch exports the op lists and the KERNEL macro so that backends can reuse
// CUDA's policy. The emulator registers exactly that policy: matmuls, linear layers and
// convolutions run in the autocast dtype (float16 or bfloat16), the ops listed as
// precision-sensitive (norms, losses, softmax, exp/log, ...) run in float32, and mixed-dtype
// ops (addcmul, cat-like promotions) in the widest input type. Every other op passes through
// the autocast key untouched. Not registered: CUDA's ban of binary_cross_entropy under
// autocast (a vendor's runtime may or may not ban it; here it simply runs).
#include "emu.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace accelreg_emu {

TORCH_LIBRARY_IMPL(_, ACCELREG_EMU_AUTOCAST_KEY, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, ACCELREG_EMU_AUTOCAST_KEY, m) {
  // the signatures in torch's lists are written unqualified, inside namespace at
  using at::IntArrayRef;
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
#define ACCELREG_EMU_LOWER(...) KERNEL(accelreg_emu::kDeviceType, __VA_ARGS__, lower_precision_fp)
#define ACCELREG_EMU_FP32(...) KERNEL(accelreg_emu::kDeviceType, __VA_ARGS__, fp32)
#define ACCELREG_EMU_FP32_SET_OPT_DTYPE(...) \
  KERNEL(accelreg_emu::kDeviceType, __VA_ARGS__, fp32_set_opt_dtype)
#define ACCELREG_EMU_PROMOTE(...) KERNEL(accelreg_emu::kDeviceType, __VA_ARGS__, promote)
#define ACCELREG_EMU_REDISPATCH(REDISPATCH_FUNC, NAME, SIGNATURE, REDISPATCH_SIGNATURE, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE(accelreg_emu::kDeviceType, REDISPATCH_FUNC, NAME,       \
                                        SIGNATURE, REDISPATCH_SIGNATURE, POLICY)
  AT_FORALL_LOWER_PRECISION_FP(ACCELREG_EMU_LOWER)
  AT_FORALL_FP32(ACCELREG_EMU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(ACCELREG_EMU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(ACCELREG_EMU_REDISPATCH)
  AT_FORALL_PROMOTE(ACCELREG_EMU_PROMOTE)
#undef ACCELREG_EMU_LOWER
#undef ACCELREG_EMU_FP32
#undef ACCELREG_EMU_FP32_SET_OPT_DTYPE
#undef ACCELREG_EMU_PROMOTE
#undef ACCELREG_EMU_REDISPATCH
}

}  // namespace accelreg_emu
