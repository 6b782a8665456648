// accelreg-emu: an emulated multi-device accelerator backed by host memory.
//
// Shared declarations of the runtime (device count, current device, per-device memory
// budgets, the tagged allocator). The backend registers under PrivateUse1 (renamed from
// Python to emu/npu/mlu/musa/sdaa) or, when built with ACCELREG_EMU_HPU, under the in-tree
// HPU device type.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <string>

namespace accelreg_emu {

#ifdef ACCELREG_EMU_HPU
constexpr c10::DeviceType kDeviceType = c10::DeviceType::HPU;
constexpr c10::DispatchKey kDispatchKey = c10::DispatchKey::HPU;
#define ACCELREG_EMU_KEY HPU
#define ACCELREG_EMU_AUTOCAST_KEY AutocastHPU
#define ACCELREG_EMU_AUTOGRAD_KEY AutogradHPU
#else
constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;
constexpr c10::DispatchKey kDispatchKey = c10::DispatchKey::PrivateUse1;
#define ACCELREG_EMU_KEY PrivateUse1
#define ACCELREG_EMU_AUTOCAST_KEY AutocastPrivateUse1
#define ACCELREG_EMU_AUTOGRAD_KEY AutogradPrivateUse1
#endif

constexpr int kMaxDevices = 64;

// Number of emulated devices (set once from Python through accelreg_emu::configure).
c10::DeviceIndex device_count() noexcept;
// The calling thread's current device (like cudaGetDevice, per host thread).
c10::DeviceIndex current_device() noexcept;
// Set the calling thread's current device; raises for an index out of range.
void set_current_device(c10::DeviceIndex index);
// Raise torch's usual "invalid device ordinal" style error for an index out of range.
void check_index(c10::DeviceIndex index);
// The index a device argument means: its own index, or the current one when it has none.
c10::DeviceIndex resolve_index(c10::Device device);
// "npu:1" (the device type's current name and the index).
std::string device_name(c10::DeviceIndex index);
// The allocator that tags memory with the current device and enforces its budget.
c10::Allocator* device_allocator();
// Memory on device ``index`` (whatever the current device is).
c10::DataPtr allocate_on(c10::DeviceIndex index, size_t nbytes);
// Grow or shrink a device storage to ``nbytes``, keeping its leading bytes.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);
// Human-readable byte count in the style of CUDA's OOM messages ("20.00 MiB").
std::string format_bytes(int64_t bytes);

}  // namespace accelreg_emu
