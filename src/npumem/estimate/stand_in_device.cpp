// A stand-in CUDA device for a CPU-only build of PyTorch, so that `npumem estimate` can run a
// script's cuda tensors as fake tensors (torch._subclasses.FakeTensorMode) on a machine with no
// GPU. It registers the two things c10 and ATen look up for a device type and do not find in a
// CPU build:
//   - a DeviceGuardImplInterface for CUDA: device and stream switches (autograd's engine, every
//     DeviceGuard, `.to("cuda")` and `copy_`) become bookkeeping;
//   - CUDAHooks (ATen's registry entry "CUDAHooks"): hasCUDA() is true, so that
//     at::getAccelerator() finds CUDA (autograd's engine asks it) and pinned memory is CPU memory.
//   - CUDA kernels for empty, empty_strided and copy_ backed by host memory: the few calls that
//     reach the device with the Python modes excluded (torch.tensor(data, device="cuda") builds
//     its tensor so, before FakeTensorMode lifts it); they hold constructor data only.
// Fake tensors themselves have no memory. The library must
// be loaded before `import torch`, since ATen reads its CUDA hooks once, at first use.
// NPUMEM_FAKE_DEVICES sets the device count (default 1). Built by npumem/estimate/native.py.
// A CUDA build of PyTorch registers its own hooks and kernels: stand_in_over_cuda.cpp builds
// this file with NPUMEM_OVER_CUDA_BUILD and registers them later, over PyTorch's.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/EmptyTensor.h>
#include <torch/library.h>
#include <cstring>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <atomic>
#include <cstdlib>
using namespace c10;
namespace {
DeviceIndex count() { const char* n = std::getenv("NPUMEM_FAKE_DEVICES"); int v = n ? std::atoi(n) : 1; return v < 1 ? 1 : (v > 64 ? 64 : v); }
thread_local DeviceIndex current = 0;
std::atomic<int64_t> next_stream{1};
struct StandIn final : impl::DeviceGuardImplInterface {
  DeviceType t;
  explicit StandIn(DeviceType t) : t(t) {}
  DeviceType type() const override { return t; }
  Device exchangeDevice(Device d) const override { Device old(t, current); current = d.index(); return old; }
  Device getDevice() const override { return Device(t, current); }
  void setDevice(Device d) const override { current = d.index(); }
  void uncheckedSetDevice(Device d) const noexcept override { current = d.index(); }
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, d); }
  Stream getNewStream(Device d, int) const override { return Stream(Stream::UNSAFE, d, next_stream++); }
  Stream exchangeStream(Stream s) const noexcept override { return Stream(Stream::DEFAULT, s.device()); }
  DeviceIndex deviceCount() const noexcept override { return count(); }
  void record(void**, const Stream&, const DeviceIndex, const EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
  void recordDataPtrOnStream(const DataPtr&, const Stream&) const override {}
};
StandIn cuda_impl(DeviceType::CUDA);
impl::DeviceGuardImplRegistrar reg(DeviceType::CUDA, &cuda_impl);
StandIn npu_impl(DeviceType::PrivateUse1);        // "npu" once renamed (--device npu)
impl::DeviceGuardImplRegistrar npu_reg(DeviceType::PrivateUse1, &npu_impl);
}
namespace at {
struct StandInHooks : CUDAHooksInterface {
  StandInHooks(CUDAHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasCuDNN() const override { return true; }
  bool compiledWithCuDNN() const override { return true; }
  // the versions of the GPU build npumem's measured tables come from (cudnn_workspaces.json)
  long versionCuDNN() const override { return 91900; }
  long versionRuntimeCuDNN() const override { return 91900; }
  long versionCUDART() const override { return 13000; }
  double batchnormMinEpsilonCuDNN() const override { return 1e-5; }   // CUDNN_BN_MIN_EPSILON
  DeviceIndex deviceCount() const override { return count(); }
  int getNumGPUs() const override { return count(); }
  DeviceIndex current_device() const override { return current; }
  DeviceIndex getCurrentDevice() const override { return current; }
  void setCurrentDevice(DeviceIndex d) const override { current = d; }
  DeviceIndex exchangeDevice(DeviceIndex d) const override { auto old = current; current = d; return old; }
  DeviceIndex maybeExchangeDevice(DeviceIndex d) const override { return exchangeDevice(d); }
  Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  Device getDeviceFromPtr(void*) const override { return Device(DeviceType::CUDA, current); }
  const Generator& getDefaultGenerator(DeviceIndex) const override { static Generator g = detail::createCPUGenerator(); return g; }
  Generator getNewGenerator(DeviceIndex) const override { return detail::createCPUGenerator(); }
  void deviceSynchronize(DeviceIndex) const override {}
};
#ifndef NPUMEM_OVER_CUDA_BUILD   // a CPU build has no CUDAHooks of its own
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", StandInHooks);
#endif
}

namespace {
// Host memory that says it is on the stand-in device (its tensors hold small data only).
template <c10::DeviceType D>
struct HostAsDevice final : c10::Allocator {
  static void del(void* p) { std::free(p); }
  c10::DataPtr allocate(size_t n) override {
    void* p = std::malloc(n ? n : 1);
    return {p, p, &del, c10::Device(D, current)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &del; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
};
HostAsDevice<c10::DeviceType::CUDA> cuda_host;
HostAsDevice<c10::DeviceType::PrivateUse1> npu_host;

template <c10::DeviceType D, c10::DispatchKey K>
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device>,
                               std::optional<bool>, std::optional<c10::MemoryFormat> format) {
  c10::Allocator* host = D == c10::DeviceType::CUDA ? static_cast<c10::Allocator*>(&cuda_host) : &npu_host;
  return at::detail::empty_generic(size, host, c10::DispatchKeySet(K),
                                   dtype.value_or(c10::ScalarType::Float), format);
}

template <c10::DeviceType D, c10::DispatchKey K>
at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                         std::optional<c10::Device>, std::optional<bool>) {
  c10::Allocator* host = D == c10::DeviceType::CUDA ? static_cast<c10::Allocator*>(&cuda_host) : &npu_host;
  return at::detail::empty_strided_generic(size, stride, host, c10::DispatchKeySet(K),
                                           dtype.value_or(c10::ScalarType::Float));
}

// the same bytes seen as a host tensor, so that the CPU's copy does the work
at::Tensor as_host(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  as_host(self).copy_(as_host(src), non_blocking);
  return self;
}
}

// The NPU's hooks (PrivateUse1, renamed "npu" by estimate for scripts written for torch_npu),
// registered at run time by npumem_stand_in_npu(): only then is PrivateUse1 the accelerator.
struct StandInNpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return count(); }
  c10::DeviceIndex getCurrentDevice() const override { return current; }
  void setCurrentDevice(c10::DeviceIndex d) const override { current = d; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override { auto old = current; current = d; return old; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  c10::Device getDeviceFromPtr(void*) const override { return {c10::DeviceType::PrivateUse1, current}; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    static at::Generator g = at::detail::createCPUGenerator();
    return g;
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override { return at::detail::createCPUGenerator(); }
};

extern "C" void npumem_stand_in_npu() {
  static StandInNpuHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

// npumem::host_copy(t): a stand-in device tensor's values, as a host tensor
at::Tensor host_copy(const at::Tensor& t) { return as_host(t).clone(); }

TORCH_LIBRARY(npumem, m) { m.def("host_copy(Tensor t) -> Tensor"); }
TORCH_LIBRARY_IMPL(npumem, CUDA, m) { m.impl("host_copy", host_copy); }
TORCH_LIBRARY_IMPL(npumem, PrivateUse1, m) { m.impl("host_copy", host_copy); }

// the CUDA kernels the stand-in needs (a CUDA build has its own, which these replace)
static void cuda_kernels(torch::Library& m) {
  m.impl("empty.memory_format", empty_memory_format<c10::DeviceType::CUDA, c10::DispatchKey::CUDA>);
  m.impl("empty_strided", empty_strided<c10::DeviceType::CUDA, c10::DispatchKey::CUDA>);
  m.impl("copy_", copy_);
}

#ifndef NPUMEM_OVER_CUDA_BUILD
TORCH_LIBRARY_IMPL(aten, CUDA, m) { cuda_kernels(m); }
#endif

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format",
         empty_memory_format<c10::DeviceType::PrivateUse1, c10::DispatchKey::PrivateUse1>);
  m.impl("empty_strided", empty_strided<c10::DeviceType::PrivateUse1, c10::DispatchKey::PrivateUse1>);
  m.impl("copy_", copy_);
}
