// The stand-in device (stand_in_device.cpp) for a CUDA build of PyTorch: the same guard, hooks and
// host-backed kernels, put in place over PyTorch's own. This library is loaded before `import
// torch` (run.BOOT), and npumem_stand_in_claim_cuda() runs after it (native.claim), once
// libc10_cuda and libtorch_cuda have made their static registrations. After both, nothing of the
// fake run reaches the CUDA runtime through c10's or ATen's lookups:
//   - hooks: at::detail::getCUDAHooks() creates the "CUDAHooks" entry of CUDAHooksRegistry at
//     its first call and keeps it, and torch._C's module init calls it, inside `import torch`.
//     So ours are registered here, on loading, at REGISTRY_PREFERRED: c10::Registry::Register
//     then skips libtorch_cuda's REGISTRY_DEFAULT (printing a line native.claim() drops);
//   - guard: c10::impl::device_guard_impl_registry[CUDA] is an atomic pointer that each
//     DeviceGuardImplRegistrar stores into and the last store wins: the claim stores ours over
//     CUDAGuardImpl (whose getDevice/setDevice/deviceCount call cudaGetDevice, cudaSetDevice,
//     cudaGetDeviceCount);
//   - kernels: the dispatcher runs the last kernel registered for an operator and key: the claim
//     replaces empty_cuda and empty_strided_cuda (the CUDA caching allocator) and gives copy_ a
//     CUDA kernel, which runs before CompositeExplicitAutograd's (whose copy_stub would call
//     cudaMemcpyAsync).
//   - dispatch stubs: a CompositeImplicitAutograd kernel runs above FakeTensorMode's Python key,
//     so with fake tensors, and some call a DispatchStub for the tensor's device type directly:
//     scaled_dot_product_attention's _fused_sdp_choice_stub (whose CUDA kernel reads the GPU's
//     properties) and the RNNs' cuDNN stubs. The claim empties their CUDA entry, as a CPU build
//     has it: attention takes the math path, an RNN stops with "missing kernel for cuda".
#define NPUMEM_OVER_CUDA_BUILD
#include "stand_in_device.cpp"

#include <ATen/native/RNN.h>
#include <ATen/native/transformers/attention.h>
#include <string>

namespace at {
C10_REGISTER_TYPED_CLASS_WITH_PRIORITY(CUDAHooksRegistry, "CUDAHooks", c10::REGISTRY_PREFERRED,
                                       StandInHooks);
}

namespace {
// Drops the dispatcher's "Overriding a previously registered kernel" warning, which our own
// registrations below are meant to cause; passes every other warning on.
struct QuietOverride final : c10::WarningHandler {
  c10::WarningHandler* next;
  explicit QuietOverride(c10::WarningHandler* next) : next(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") == std::string::npos)
      next->process(warning);
  }
};
}

// 0: the stand-in is CUDA's device now; 1: ATen uses other CUDA hooks than ours.
extern "C" int npumem_stand_in_claim_cuda() {
  static c10::impl::DeviceGuardImplRegistrar guard(DeviceType::CUDA, &cuda_impl);
  static const bool kernels_registered = [] {
    QuietOverride quiet(c10::WarningUtils::get_warning_handler());
    c10::WarningUtils::WarningHandlerGuard scope(&quiet);
    static torch::Library kernels(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA,
                                  __FILE__, __LINE__);
    cuda_kernels(kernels);
    return true;
  }();
  (void)kernels_registered;
  using namespace at::native;
  _fused_sdp_choice_stub.set_cuda_dispatch_ptr(nullptr);
  lstm_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  lstm_packed_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  gru_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  gru_packed_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  rnn_tanh_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  rnn_tanh_packed_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  rnn_relu_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  rnn_relu_packed_cudnn_stub.set_cuda_dispatch_ptr(nullptr);
  return dynamic_cast<const at::StandInHooks*>(&at::detail::getCUDAHooks()) ? 0 : 1;
}
