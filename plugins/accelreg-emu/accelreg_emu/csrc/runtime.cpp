// Runtime of the emulated accelerator: device state, budgeted allocator, device guard,
// accelerator hooks and the control operators Python uses (torch.ops.accelreg_emu.*).
#include "emu.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/Generator.h>
#ifdef ACCELREG_EMU_HPU
#include <ATen/detail/HPUHooksInterface.h>
#else
#include <ATen/detail/PrivateUse1HooksInterface.h>
#endif
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/DeviceCapability.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace accelreg_emu {
namespace {

constexpr int64_t kDefaultCapacity = int64_t{64} << 30;  // 64 GiB

struct DeviceStats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> capacity{kDefaultCapacity};
  std::atomic<int64_t> allocations{0};    // count since the last reset of accumulated stats
  std::atomic<int64_t> frees{0};
  std::atomic<int64_t> bytes_allocated{0};  // cumulative bytes
  std::atomic<int64_t> bytes_freed{0};
  std::atomic<int64_t> num_ooms{0};
};

std::array<DeviceStats, kMaxDevices> g_stats;
std::atomic<int> g_device_count{2};
thread_local c10::DeviceIndex t_current_device = 0;

// ---------------------------------------------------------------- memory budget

[[noreturn]] void raise_oom(c10::DeviceIndex index, int64_t request, int64_t in_use) {
  const int64_t capacity = g_stats[index].capacity.load();
  const int64_t free_bytes = capacity > in_use ? capacity - in_use : 0;
  std::string type = c10::DeviceTypeName(kDeviceType, /*lower_case=*/true);
  for (auto& ch : type) {
    ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  }
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, type, " out of memory. Tried to allocate ", format_bytes(request),
      ". Device ", device_name(index), " has a total capacity of ", format_bytes(capacity),
      " of which ", format_bytes(free_bytes), " is free. Of the allocated memory ",
      format_bytes(in_use),
      " is allocated by tensors on this device. (emulated by accelreg-emu; "
      "ACCELREG_EMU_MEMORY sets the capacity)");
}

void reserve(c10::DeviceIndex index, int64_t nbytes) {
  auto& stats = g_stats[index];
  int64_t current = stats.allocated.load();
  do {
    if (current + nbytes > stats.capacity.load()) {
      stats.num_ooms.fetch_add(1);
      raise_oom(index, nbytes, current);
    }
  } while (!stats.allocated.compare_exchange_weak(current, current + nbytes));
  const int64_t now = current + nbytes;
  int64_t peak = stats.peak.load();
  while (now > peak && !stats.peak.compare_exchange_weak(peak, now)) {
  }
  stats.allocations.fetch_add(1);
  stats.bytes_allocated.fetch_add(nbytes);
}

void release(c10::DeviceIndex index, int64_t nbytes) noexcept {
  auto& stats = g_stats[index];
  stats.allocated.fetch_sub(nbytes);
  stats.frees.fetch_add(1);
  stats.bytes_freed.fetch_add(nbytes);
}

void fill(c10::CachingDeviceAllocator::StatArray& array, int64_t current, int64_t peak,
          int64_t allocated, int64_t freed) {
  auto& stat = array[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
  stat.current = current;
  stat.peak = peak;
  stat.allocated = allocated;
  stat.freed = freed;
}

// ---------------------------------------------------------------- allocator

struct Block {
  void* data;
  int64_t nbytes;
  c10::DeviceIndex index;
};

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  c10::free_cpu(block->data);
  release(block->index, block->nbytes);
  delete block;
}

// A DeviceAllocator, so torch.accelerator.memory_stats() & co. work for this device type.
// Nothing is cached: reserved memory is allocated memory, and empty_cache has nothing to do.
struct EmuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = current_device();
    const auto size = static_cast<int64_t>(nbytes);
    reserve(index, size);
    void* data = nullptr;
    try {
      data = c10::alloc_cpu(nbytes);
    } catch (...) {
      release(index, size);
      throw;
    }
    auto* block = new Block{data, size, index};
    return {data, block, &free_block, c10::Device(kDeviceType, index)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;  // the context is a Block, not the data pointer
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count != 0) {
      std::memcpy(dest, src, count);
    }
  }

  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t /*pool*/) override {}
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    check_index(index);
    const auto& s = g_stats[index];
    c10::CachingDeviceAllocator::DeviceStats out;
    const int64_t current = s.allocated.load();
    const int64_t peak = s.peak.load();
    const int64_t allocs = s.allocations.load();
    const int64_t frees = s.frees.load();
    const int64_t live = allocs - frees;
    for (auto* array : {&out.allocated_bytes, &out.reserved_bytes, &out.active_bytes,
                        &out.requested_bytes}) {
      fill(*array, current, peak, s.bytes_allocated.load(), s.bytes_freed.load());
    }
    for (auto* array : {&out.allocation, &out.segment, &out.active}) {
      fill(*array, live, live, allocs, frees);
    }
    out.num_ooms = s.num_ooms.load();
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override {
    check_index(index);
    auto& s = g_stats[index];
    s.bytes_allocated.store(0);
    s.bytes_freed.store(0);
    s.num_ooms.store(0);
  }
  void resetPeakStats(c10::DeviceIndex index) override {
    check_index(index);
    g_stats[index].peak.store(g_stats[index].allocated.load());
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    check_index(index);
    const int64_t total = g_stats[index].capacity.load();
    const int64_t used = g_stats[index].allocated.load();
    return {static_cast<size_t>(std::max<int64_t>(total - used, 0)), static_cast<size_t>(total)};
  }
};

EmuAllocator g_allocator;
REGISTER_ALLOCATOR(kDeviceType, &g_allocator);

// Host memory that reports as pinned (pin_memory() of a CPU tensor for this device type).
std::mutex g_pinned_mutex;
std::unordered_set<const void*> g_pinned;

void free_pinned(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(data);
  }
  c10::free_cpu(data);
}

// Registered as the device type's host allocator too: torch.accelerator.empty_host_cache() (vLLM
// calls it at shutdown) asks for it, and a runtime without one crashes there (torch_npu has one).
// Nothing is cached, so there is nothing to empty or count.
struct PinnedAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = c10::alloc_cpu(nbytes);
    {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(data);
    }
    return {data, data, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count != 0) {
      std::memcpy(dest, src, count);
    }
  }
  // Work is synchronous on the host: a block is free again as soon as it is released.
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override {
    return true;
  }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    return {};
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

PinnedAllocator g_pinned_allocator;
REGISTER_HOST_ALLOCATOR(kDeviceType, &g_pinned_allocator);

bool is_pinned_ptr(const void* data) {
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  return g_pinned.count(data) != 0;
}

// ---------------------------------------------------------------- streams and events

// Work runs synchronously on the host, so a stream is only an id and an event a timestamp.
thread_local std::array<c10::StreamId, kMaxDevices> t_current_stream{};
std::atomic<c10::StreamId> g_next_stream{1};

struct Event {
  std::chrono::steady_clock::time_point when;
};

struct EmuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kDeviceType;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    if (device.index() != old.index()) {
      setDevice(device);
    }
    return old;
  }
  c10::Device getDevice() const override {
    return {kDeviceType, current_device()};
  }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kDeviceType, "expected a ", c10::DeviceTypeName(kDeviceType, true),
                " device, got ", device);
    set_current_device(resolve_index(device));
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < device_count()) {
      t_current_device = device.index();
    }
  }
  c10::Stream getStream(c10::Device device) const override {
    const auto index = resolve_index(device);
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, index}, t_current_stream[index]);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, {kDeviceType, resolve_index(device)});
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*high_priority*/) const override {
    return getNewStream(device, 0);
  }
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, resolve_index(device)},
                       g_next_stream.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    const auto index = resolve_index(stream.device());
    const c10::Stream old(c10::Stream::UNSAFE, {kDeviceType, index}, t_current_stream[index]);
    t_current_stream[index] = stream.id();
    return old;
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void record(void** event, const c10::Stream& /*stream*/, const c10::DeviceIndex /*index*/,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) {
      *event = new Event{};
    }
    static_cast<Event*>(*event)->when = std::chrono::steady_clock::now();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override {
    return {};
  }
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*index*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    const auto delta = static_cast<Event*>(end)->when - static_cast<Event*>(start)->when;
    return std::chrono::duration<double, std::milli>(delta).count();
  }
};

C10_REGISTER_GUARD_IMPL(ACCELREG_EMU_KEY, EmuGuardImpl);

// ---------------------------------------------------------------- accelerator hooks

#ifdef ACCELREG_EMU_HPU
using HooksBase = at::HPUHooksInterface;
#else
using HooksBase = at::PrivateUse1HooksInterface;
#endif

struct EmuHooks : HooksBase {
  EmuHooks() = default;
#ifdef ACCELREG_EMU_HPU
  explicit EmuHooks(at::HPUHooksArgs /*unused*/) {}
#endif

  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  void init() const override {}
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    set_current_device(index);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const auto old = current_device();
    set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  // Kernels run on the host, so the device's generator is the host's default generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex /*index*/) const override {
    return at::detail::createCPUGenerator();
  }
  c10::Device getDeviceFromPtr(void* /*data*/) const override {
    return {kDeviceType, current_device()};
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned_ptr(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
#ifdef ACCELREG_EMU_HPU
  bool hasHPU() const override {
    return device_count() > 0;
  }
#else
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
#endif
};

#ifndef ACCELREG_EMU_HPU
struct RegisterHooks {
  RegisterHooks() {
    static EmuHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
};
RegisterHooks g_register_hooks;
#endif

// ---------------------------------------------------------------- control operators

void configure(int64_t devices, std::vector<int64_t> capacities) {
  TORCH_CHECK(devices >= 0 && devices <= kMaxDevices, "accelreg-emu supports 0..", kMaxDevices,
              " devices, got ", devices);
  TORCH_CHECK(capacities.empty() || static_cast<int64_t>(capacities.size()) == devices,
              "accelreg-emu: ", capacities.size(), " capacities for ", devices, " devices");
  g_device_count.store(static_cast<int>(devices));
  for (int64_t i = 0; i < devices; ++i) {
    g_stats[i].capacity.store(capacities.empty() ? kDefaultCapacity : capacities[i]);
  }
  if (t_current_device >= devices) {
    t_current_device = 0;
  }
}

int64_t op_device_count() {
  return device_count();
}
int64_t op_current_device() {
  return current_device();
}
void op_set_device(int64_t index) {
  set_current_device(static_cast<c10::DeviceIndex>(index));
}
DeviceStats& stats_of(int64_t index) {
  check_index(static_cast<c10::DeviceIndex>(index));
  return g_stats[index];
}
int64_t op_memory_allocated(int64_t index) {
  return stats_of(index).allocated.load();
}
int64_t op_max_memory_allocated(int64_t index) {
  return stats_of(index).peak.load();
}
int64_t op_capacity(int64_t index) {
  return stats_of(index).capacity.load();
}
int64_t op_allocation_count(int64_t index) {
  auto& stats = stats_of(index);
  return stats.allocations.load() - stats.frees.load();
}
void op_reset_peak(int64_t index) {
  auto& stats = stats_of(index);
  stats.peak.store(stats.allocated.load());
}
void op_set_capacity(int64_t index, int64_t capacity) {
  stats_of(index).capacity.store(capacity);
}

}  // namespace

// ---------------------------------------------------------------- shared helpers

c10::DeviceIndex device_count() noexcept {
  return static_cast<c10::DeviceIndex>(g_device_count.load());
}

c10::DeviceIndex current_device() noexcept {
  return t_current_device;
}

void check_index(c10::DeviceIndex index) {
  const auto count = device_count();
  TORCH_CHECK(index >= 0 && index < count, "Invalid device index ", static_cast<int>(index), ": ",
              c10::DeviceTypeName(kDeviceType, true), " has ", static_cast<int>(count),
              " device(s) (accelreg-emu)");
}

void set_current_device(c10::DeviceIndex index) {
  check_index(index);
  t_current_device = index;
}

c10::DeviceIndex resolve_index(c10::Device device) {
  if (!device.has_index()) {
    return current_device();
  }
  check_index(device.index());
  return device.index();
}

std::string device_name(c10::DeviceIndex index) {
  return c10::Device(kDeviceType, index).str();
}

c10::Allocator* device_allocator() {
  return &g_allocator;
}

c10::DataPtr allocate_on(c10::DeviceIndex index, size_t nbytes) {
  check_index(index);
  const auto saved = t_current_device;
  t_current_device = index;
  try {
    auto data = g_allocator.allocate(nbytes);
    t_current_device = saved;
    return data;
  } catch (...) {
    t_current_device = saved;
    throw;
  }
}

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  const auto index = storage.device().type() == kDeviceType ? storage.device().index()
                                                            : current_device();
  c10::DataPtr fresh = allocate_on(index, nbytes);
  const size_t keep = std::min(nbytes, impl->nbytes());
  if (keep != 0) {
    std::memcpy(fresh.get(), impl->data(), keep);
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

std::string format_bytes(int64_t bytes) {
  char buffer[64];
  const double value = static_cast<double>(bytes);
  if (bytes < 1024) {
    std::snprintf(buffer, sizeof(buffer), "%lld bytes", static_cast<long long>(bytes));
  } else if (bytes < (int64_t{1} << 20)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f KiB", value / 1024.0);
  } else if (bytes < (int64_t{1} << 30)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f MiB", value / 1048576.0);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f GiB", value / 1073741824.0);
  }
  return buffer;
}

TORCH_LIBRARY(accelreg_emu, m) {
  m.def("configure(int devices, int[] capacities) -> ()", &configure);
  m.def("device_count() -> int", &op_device_count);
  m.def("current_device() -> int", &op_current_device);
  m.def("set_device(int index) -> ()", &op_set_device);
  m.def("memory_allocated(int index) -> int", &op_memory_allocated);
  m.def("max_memory_allocated(int index) -> int", &op_max_memory_allocated);
  m.def("capacity(int index) -> int", &op_capacity);
  m.def("set_capacity(int index, int capacity) -> ()", &op_set_capacity);
  m.def("live_allocations(int index) -> int", &op_allocation_count);
  m.def("reset_peak_memory_stats(int index) -> ()", &op_reset_peak);
}

}  // namespace accelreg_emu

#ifdef ACCELREG_EMU_HPU
// getHPUHooks() creates the hooks registered under the key "HPUHooks".
namespace at {
C10_REGISTER_TYPED_CLASS(HPUHooksRegistry, "HPUHooks", accelreg_emu::EmuHooks)
}  // namespace at
#endif
