"""What happens at each operator of the fake run (TensorRecorder.intercept): a value read from a
tensor is answered (its shadow, else answers.py), small host work runs for real, everything
else runs on fake tensors, the results are recorded (views are not allocations), small results
get their shadows, and the kernels' own workspaces are added after the operator's outputs, in
the order the GPU allocates them.
"""

from __future__ import annotations

import time

from .conv_workspace import FIND_LABEL

ESTIMATED = ("cuda", "npu")         # the device types whose memory is estimated
PROGRESS_EVERY = 16384              # operators between looks at the clock
# Operators whose CUDA kernels take scratch from the caching allocator inside the kernel, out of
# a fake run's sight: CUB's temporary storage (ATen/cuda/cub.cuh: sorts, scans, selections) and
# the buffers around it (EmbeddingBackwardKernel.cu, Indexing.cu's sorted indices, UniqueCub.cu,
# Randperm.cu). Transient, they matter only where they fall on the peak: the verdict says so.
HIDDEN_SCRATCH = {"sort", "topk", "nonzero", "nonzero_static", "_unique2", "unique_consecutive",
                  "unique_dim", "cumsum", "cumprod", "logcumsumexp", "cummax", "cummin",
                  "embedding_dense_backward", "_index_put_impl_", "randperm", "masked_scatter",
                  "_embedding_bag", "_embedding_bag_backward", "bincount", "multinomial"}


# Operators that draw from the device's random numbers: a GPU draws other values than the CPU
# shadow does, so the value read from one (torch.rand(1, device="cuda").item()) is a guess, as
# an assumed one is (decisions.py). Values computed from a draw are not followed: most checks
# on them hold for any draw (token ids from randint are never negative)
RANDOM_OPS = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
              "normal", "normal_", "uniform_", "bernoulli", "bernoulli_", "exponential_",
              "geometric_", "log_normal_", "cauchy_", "random_", "multinomial", "poisson",
              "native_dropout"}


class OperatorHook:
    def __init__(self, torch, recorder, rules, shadows, answers, fake):
        from torch._subclasses.fake_tensor import (DynamicOutputShapeException, FakeTensor,
                                                   UnsupportedOperatorException,
                                                   unset_fake_temporarily)
        self.torch, self.recorder, self.rules = torch, recorder, rules
        self.shadows, self.answers = shadows, answers
        self.fake = fake                    # FakeCache: FakeTensorMode's answers, remembered
        self.fake_type, self.unset_fake = FakeTensor, unset_fake_temporarily
        self.dynamic, self.unsupported_error = DynamicOutputShapeException, UnsupportedOperatorException
        self.local_scalar = torch.ops.aten._local_scalar_dense.default
        # PyTorch's C++ asks a fake tensor its device through the dispatcher (prim.device): an
        # artefact of fake tensors that a GPU run never dispatches, answered first, not counted
        self.device_of = torch.ops.prim.device.default
        self.names: dict = {}               # operator -> aten's name, no namespace
        self.progress = None                # called every PROGRESS_EVERY operators
        self.empty_cache = None             # called where PyTorch empties the cache itself
        self.calls = 0
        self.nanoseconds = 0                # inside the operators: fake kernels and all
        self.unsupported: dict = {}         # operator -> calls FakeTensorMode has no kernel for

    def __call__(self, func, args, kwargs, outputs):
        started = time.perf_counter_ns()
        try:
            return self._operator(func, args, kwargs, outputs)
        finally:
            self.nanoseconds += time.perf_counter_ns() - started

    def _operator(self, func, args, kwargs, outputs):
        if func is self.device_of and type(args[0]) is self.fake_type:
            return args[0].fake_device
        self.calls += 1
        if not self.calls % PROGRESS_EVERY and self.progress is not None:
            self.progress(self.calls)
        if func is self.local_scalar:
            return self._value(args[0])
        shadows = self.shadows
        name = self.names.get(func)
        if name is None:
            name = self.names[func] = func._schema.name.split("::", 1)[-1]
        real = shadows.real_inputs(args, kwargs)
        if real is not None and not real[2]:    # the host alone
            if shadows.small_on_host(args):
                real_out = shadows.run(func, *real[:2])
                if real_out is not None:
                    outputs(real_out)           # small: real values
                    return real_out
            real = None
        try:
            out = self.fake(func, args, kwargs)
        except self.dynamic:
            real_out = shadows.run(func, *real[:2]) if real is not None else None
            out = shadows.fake_like(real_out, args) if real_out is not None else \
                self.answers.dynamic(name, func, args, kwargs, self.torch)
            if out is None:
                raise
        except (self.unsupported_error, RuntimeError) as exc:
            if not isinstance(exc, self.unsupported_error) and (
                    func.namespace in ("aten", "prims") or "fake" not in str(exc)):
                raise                   # an error of the script's own: as a GPU would raise it
            self.unsupported[name] = self.unsupported.get(name, 0) + 1
            out = self._without_fake_kernel(func, args, kwargs)
            if out is None:
                raise
        real_out = shadows.run(func, *real[:2]) if real is not None and shadows.small(out) \
            else shadows.absorbed(name, args, out)
        if not func.is_view:                 # a view never allocates (fake views from
            outputs(out)                     # FakeTensorMode's cache may carry a new storage)
        if real_out is not None:
            shadows.attach(out, real_out)
            if real is not None and real[2] and name in RANDOM_OPS:
                self._mark_random(out)
        self.answers.remember(name, out, self.torch)
        self._workspaces(name, args)
        return out

    def _value(self, tensor):
        """`.item()`: the tensor's real value where it has one, else the documented answer."""
        if not isinstance(tensor, self.fake_type) and tensor.device.type == "cpu":
            shadow = tensor
        else:
            shadow = getattr(tensor, "_npumem_shadow", None)
        if shadow is None:
            return self.answers.scalar(tensor, self.torch)
        with self.unset_fake():
            value = shadow.item()
        if getattr(tensor, "_npumem_random", False):
            return self.answers.random(tensor, value, self.torch)
        return value

    def _mark_random(self, out) -> None:
        for item in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(item, self.fake_type):
                item._npumem_random = True

    def _without_fake_kernel(self, func, args, kwargs):
        """A custom operator (not aten's) with no fake kernel: its tensor results taken shaped as
        its first tensor input, said in the verdict line (its real outputs and scratch are
        unknown). None where that cannot stand in (aten's own, no tensor input, other results)."""
        torch = self.torch
        if func.namespace in ("aten", "prims"):
            return None
        first = next((a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)), None)
        returns = [str(r.type) for r in func._schema.returns]
        if first is None or not returns or any(r != "Tensor" for r in returns):
            return None
        self.answers.unmodelled(f"custom operator {func.name()} (no fake kernel: outputs taken "
                                f"shaped as its input, its scratch unknown)")
        like = torch.ops.aten.empty_like.default
        outs = [self.fake(like, (first,), {}) for _ in returns]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _workspaces(self, name, args) -> None:
        first = args[0] if args else None
        if isinstance(first, self.torch.Tensor) and first.device.type == "cuda":
            if name in HIDDEN_SCRATCH:
                self.answers.unmodelled(f"{name}'s scratch")
            elif name == "convolution" and self.torch.backends.cudnn.benchmark:
                self.answers.unmodelled("cudnn.benchmark's choice of plan (the fastest: its "
                                        "workspace may be above the likely one)")
            for size, label, temporary in self.rules.workspaces(name, args):
                self.recorder.record_extra(size, first.device, label, temporary)
                if label == FIND_LABEL and self.empty_cache is not None:
                    self.empty_cache()      # Conv_v8.cpp get_plans_from_find, after the search
