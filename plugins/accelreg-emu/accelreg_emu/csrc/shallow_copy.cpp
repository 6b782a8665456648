// Parameter identity across host <-> device moves.
//
// ``nn.Module._apply`` (``module.to(device)``) keeps a parameter object and swaps its data
// (``param.data = moved``) only when ``torch._has_compatible_shallow_copy_type(param, moved)``
// says yes; otherwise it wraps the moved tensor in a *new* Parameter, and an optimizer built
// before the move keeps updating the old (host) objects. torch answers yes between the cpu and
// its in-tree dense backends (CUDA, XPU, HPU, ...), never for PrivateUse1; so the vendors'
// PrivateUse1 runtimes (torch_npu, torch_mlu) register their own kernel for the operator,
// counting their device as dense like the cpu. The emulator does the same, for every name it
// presents under PrivateUse1 (the hpu variant is in-tree: torch's answer already holds there).
//
// ``set_shallow_copy_compatible(False)`` (``ACCELREG_EMU_SHALLOW_COPY=0``) restores torch's
// default answer, so tests can still see a PrivateUse1 runtime that registers no override.
#include "emu.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <atomic>

namespace accelreg_emu {
namespace {

std::atomic<bool> g_shallow_copy_compatible{true};

// Dense strided tensors on the host or on this device (no sparse, quantized or nested ones).
bool host_or_device_dense(c10::DispatchKeySet keys) {
  constexpr auto backends = c10::DispatchKeySet(
      {c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit});
  return keys.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && keys.has_any(backends);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // torch's own rule first (same key set; sparse with sparse; ...).
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) {
    return true;
  }
  return g_shallow_copy_compatible.load() && host_or_device_dense(self.key_set()) &&
         host_or_device_dense(from.key_set());
}

void op_set_shallow_copy_compatible(bool enabled) {
  g_shallow_copy_compatible.store(enabled);
}

bool op_shallow_copy_compatible() {
  return g_shallow_copy_compatible.load();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(accelreg_emu, m) {
  m.def("set_shallow_copy_compatible(bool enabled) -> ()", &op_set_shallow_copy_compatible);
  m.def("shallow_copy_compatible() -> bool", &op_shallow_copy_compatible);
}

#ifndef ACCELREG_EMU_HPU
// The operator is CompositeImplicitAutograd: a tensor with autograd keys reaches the autograd
// key first, so the kernel is registered there as well as under the backend key.
TORCH_LIBRARY_IMPL(aten, ACCELREG_EMU_KEY, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

TORCH_LIBRARY_IMPL(aten, ACCELREG_EMU_AUTOGRAD_KEY, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}
#endif

}  // namespace accelreg_emu
