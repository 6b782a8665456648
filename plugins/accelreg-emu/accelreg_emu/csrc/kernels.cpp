// The operators that cannot go through the CPU fallback: factories (they allocate on the
// device), views (they must share the device storage), storage surgery (resize_, set_) and
// the copies and reads that cross the host/device boundary.
#include "emu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_copy_from_and_resize_native.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_neg_view.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/conj.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <torch/library.h>

namespace accelreg_emu {
namespace {

c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  if (device.has_value()) {
    TORCH_CHECK(device->type() == kDeviceType, "accelreg-emu cannot allocate on ", *device);
    return resolve_index(*device);
  }
  return current_device();
}

void check_strided(std::optional<c10::Layout> layout) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::Layout::Strided,
              "accelreg-emu supports only strided tensors, got layout ", *layout);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<c10::MemoryFormat> memory_format) {
  check_strided(layout);
  const c10::DeviceGuard guard(c10::Device(kDeviceType, index_of(device)));
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(kDispatchKey),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> /*pin_memory*/) {
  check_strided(layout);
  const c10::DeviceGuard guard(c10::Device(kDeviceType, index_of(device)));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(kDispatchKey),
                                           c10::dtype_or_default(dtype));
}

// A CPU tensor over the same bytes as ``t`` (``t`` itself when it is on the CPU already).
at::Tensor host_view(const at::Tensor& t) {
  if (t.device().type() != kDeviceType) {
    return t;
  }
  auto* data = static_cast<char*>(t.storage().mutable_data()) + t.storage_offset() * t.itemsize();
  auto host = at::from_blob(data, t.sizes(), t.strides(),
                            at::TensorOptions().dtype(t.scalar_type()).device(c10::kCPU));
  // The lazy conjugate and negative bits (torch.fft.ifft's result, x.conj()) travel with the
  // view, so the CPU copy resolves them as it would on the device.
  if (t.is_conj()) {
    host = host.conj();
  }
  if (t.is_neg()) {
    host = host._neg_view();
  }
  return host;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK(self.defined() && dst.defined(), "accelreg-emu: copy of an undefined tensor");
  if (self.numel() == 0 || dst.numel() == 0) {
    return dst;
  }
  // Work is synchronous, so a copy in any direction is a host memcpy (with dtype conversion
  // and broadcasting done by the CPU kernel).
  auto host_dst = host_view(dst);
  host_dst.copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::_local_scalar_dense(host_view(self));
}

void ensure_storage(const at::Tensor& self, size_t nbytes) {
  auto storage = self.storage();
  if (nbytes > storage.nbytes()) {
    resize_storage_bytes(storage, nbytes);
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (impl->numel() > 0) {
    ensure_storage(self, at::detail::computeStorageNbytesContiguous(
                             size, self.itemsize(), impl->storage_offset()));
  }
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  if (impl->numel() > 0) {
    ensure_storage(self, stride.empty() ? at::detail::computeStorageNbytesContiguous(
                                              size, self.itemsize(), offset)
                                        : at::detail::computeStorageNbytes(
                                              size, stride, self.itemsize(), offset));
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

at::Tensor& set_tensor_offset(at::Tensor& self, const at::Tensor& source, int64_t offset,
                              c10::IntArrayRef size, c10::IntArrayRef stride) {
  return set_storage_offset(self, source.storage(), offset, size, stride);
}

at::Tensor& set_empty(at::Tensor& self) {
  const auto index = self.device().index();
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocate_on(index, 0),
                       device_allocator(), /*resizable=*/true);
  return set_storage_offset(self, std::move(storage), 0, {0}, {});
}

void record_stream(at::Tensor& /*self*/, c10::Stream /*stream*/) {
  // Memory is freed synchronously: nothing to track.
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, ACCELREG_EMU_KEY, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_.source_Tensor_storage_offset", TORCH_FN(set_tensor_offset));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("record_stream", TORCH_FN(record_stream));
}

// torch's conjugate and negative fallbacks resolve a lazy bit with a clone, whose copy comes
// back to ``_copy_from``: without these fallthroughs that recursion never ends (a segfault on
// ``torch.fft.ifft(x).cpu()``). ``copy_from`` resolves the bits on the host instead.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace accelreg_emu
