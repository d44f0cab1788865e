// A library that answers for the NVIDIA driver (libcuda.so.1) or NVML (libnvidia-ml.so.1) in
// `npumem estimate`'s fake run under a CUDA build of PyTorch, built by native.py under each of
// those names. native.claim() loads both before `import torch`; the dynamic loader then hands
// this library to every later dlopen of either name (glibc matches a requested name against the
// sonames of the libraries already loaded before searching any path), so the real driver never
// enters the process: the GPU cannot be reached, also on a machine that has one, and the CUDA
// runtime sees what it sees on a machine with none. The entry points every user of the driver
// looks up first (the CUDA runtime, c10's DriverAPI, cuda-bindings, NVML) fail as with no
// device, and count their calls: npumem_driver_calls() is 0 after a fake run that never asked.
#include <atomic>

namespace {
std::atomic<int> calls{0};
constexpr int kNoDevice = 100;         // CUDA_ERROR_NO_DEVICE
constexpr int kNotFound = 500;         // CUDA_ERROR_NOT_FOUND
constexpr int kDriverNotLoaded = 9;    // NVML_ERROR_DRIVER_NOT_LOADED
}

extern "C" {
int npumem_driver_calls() { return calls.load(); }
int cuInit(unsigned) { ++calls; return kNoDevice; }
int cuDriverGetVersion(int* version) {
  ++calls;
  if (version) *version = 0;
  return kNoDevice;
}
// (symbol, function, cudaVersion, flags, status): no function, status "symbol not found" (1)
int cuGetProcAddress_v2(const char*, void** function, int, unsigned long long, int* status) {
  ++calls;
  if (function) *function = nullptr;
  if (status) *status = 1;
  return kNotFound;
}
int cuGetProcAddress(const char* symbol, void** function, int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, function, version, flags, nullptr);
}
int nvmlInit() { ++calls; return kDriverNotLoaded; }
int nvmlInit_v2() { ++calls; return kDriverNotLoaded; }
int nvmlInitWithFlags(unsigned) { ++calls; return kDriverNotLoaded; }
}
