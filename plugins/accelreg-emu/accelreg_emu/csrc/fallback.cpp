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

int64_t as_int(const c10::IValue& v) {
  return v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
}

// Convolutions on a backend without cuDNN/MKL-DNN dispatch to ``convolution_overrideable`` and
// its backward, whose only kernels (CompositeExplicitAutograd, so the fallback above is never
// reached) are stubs that throw: run the CPU's own ``convolution`` and ``convolution_backward``
// instead (the same arguments; the backward also takes the bias size).
void convolution_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_same_device(op, *stack);
  static const auto conv = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  at::native::cpu_fallback(conv, stack, /*error_on_views=*/true);
}

void convolution_backward_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_same_device(op, *stack);
  // grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups,
  // output_mask: convolution_backward takes bias_sizes after weight
  constexpr size_t kArgs = 10;
  TORCH_INTERNAL_ASSERT(stack->size() >= kArgs);
  const size_t first = stack->size() - kArgs;
  const at::Tensor weight = (*stack)[first + 2].toTensor();
  const bool transposed = (*stack)[first + 6].toBool();
  const int64_t groups = as_int((*stack)[first + 8]);
  const int64_t bias_size = transposed ? weight.size(1) * groups : weight.size(0);
  stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(first + 3),
                c10::IValue(std::vector<int64_t>{bias_size}));
  static const auto backward =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  at::native::cpu_fallback(backward, stack, /*error_on_views=*/true);
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

TORCH_LIBRARY_IMPL(aten, ACCELREG_EMU_KEY, m) {
  m.impl("convolution_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_on_host>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_backward_on_host>());
}

}  // namespace accelreg_emu
