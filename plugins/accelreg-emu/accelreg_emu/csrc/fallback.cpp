// The boxed fallback: every operator without an explicit kernel runs on the host through
// torch's CPU fallback, after the same-device check a real accelerator's kernels make.
#include "emu.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>

namespace accelreg_emu {
namespace {

// Tracks the first device seen among an operator's tensor arguments and rejects a second.
class DeviceCheck {
 public:
  explicit DeviceCheck(const c10::OperatorHandle& op) : op_(op) {}

  // ``host_ok``: a host tensor of any shape is accepted here (index lists: real backends
  // move CPU indices themselves). A 0-dim host tensor is always accepted, as a scalar.
  void visit(const at::Tensor& t, const c10::Argument& arg, bool host_ok) {
    if (!t.defined()) {
      return;
    }
    const c10::Device device = t.device();
    if (device.type() != kDeviceType && (host_ok || t.dim() == 0)) {
      return;
    }
    if (!common_.has_value()) {
      common_ = device;
      return;
    }
    if (*common_ != device) {
      const auto& name = op_.schema().operator_name();
      std::string method = name.name;
      const auto sep = method.find("::");
      if (sep != std::string::npos) {
        method = method.substr(sep + 2);
      }
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two ",
                  "devices, ", *common_, " and ", device, "! (when checking argument for argument ",
                  arg.name(), " in method wrapper_", c10::toString(kDispatchKey), "_",
                  name.overload_name, "_", method, ")");
    }
  }

 private:
  const c10::OperatorHandle& op_;
  std::optional<c10::Device> common_;
};

void check_same_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& schema_args = op.schema().arguments();
  const auto arguments = torch::jit::last(stack, schema_args.size());
  DeviceCheck check(op);
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto& value = arguments[i];
    if (value.isTensor()) {
      check.visit(value.toTensor(), schema_args[i], false);
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) {
        check.visit(t, schema_args[i], false);
      }
    } else if (value.isOptionalTensorList()) {
      for (const std::optional<at::Tensor> t : value.toOptionalTensorList()) {
        if (t.has_value()) {
          check.visit(*t, schema_args[i], true);
        }
      }
    }
  }
}

void emu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_same_device(op, *stack);
  // error_on_views: a view op without a kernel here would silently become a copy.
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, ACCELREG_EMU_KEY, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&emu_fallback>());
}

// torch.autocast(<device type>) needs the autocast key to pass through. No lower-precision
// cast policy is registered: inside autocast, ops run in the dtypes they are given.
TORCH_LIBRARY_IMPL(_, ACCELREG_EMU_AUTOCAST_KEY, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace accelreg_emu
