// nn.GRU, GRUCell, LSTM and LSTMCell on the device: torch sends a device's cells to the fused
// _thnn_fused_gru_cell / _thnn_fused_lstm_cell, which have kernels for CUDA only (the boxed
// CPU fallback finds none). They are registered at the device's autograd key as their unfused
// math, so autograd records the plain operators and no fused backward is needed.
#include "emu.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace accelreg_emu {
namespace {

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates.add(*bias) : gates;
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates,
                                                  const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx,
                                                  const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  const auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  const auto hid = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  const at::Tensor reset = in[0].add(hid[0]).sigmoid();
  const at::Tensor update = in[1].add(hid[1]).sigmoid();
  const at::Tensor candidate = in[2].add(reset.mul(hid[2])).tanh();
  at::Tensor hy = candidate.add(update.mul(hx.sub(candidate)));
  at::Tensor workspace = hy.new_empty({0});
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const auto gates =
      with_bias(with_bias(input_gates.add(hidden_gates), input_bias), hidden_bias).chunk(4, 1);
  at::Tensor cy = gates[1].sigmoid().mul(cx).add(gates[0].sigmoid().mul(gates[2].tanh()));
  at::Tensor hy = gates[3].sigmoid().mul(cy.tanh());
  at::Tensor workspace = hy.new_empty({0});
  return {hy, cy, workspace};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, ACCELREG_EMU_AUTOGRAD_KEY, m) {
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
}

}  // namespace accelreg_emu
