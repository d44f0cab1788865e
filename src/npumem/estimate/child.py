"""The process that runs the user's script under `npumem estimate` (started by run.py).

The stand-in device library is loaded before `import torch` (by the command line run.py
builds); then this module makes every tensor fake (FakeTensorMode: shapes, dtypes and devices,
no memory and no computation), records each storage the script creates and frees with its
stack and category (TensorRecorder), adds the allocations the GPU's kernels make on their own
(kernel_rules), picks the attention kernel the target would (attention), answers data-dependent
questions (answers), and serves torch.cuda's calls from a live allocator model (device_api).
What it writes: the recording as a PyTorch snapshot (no segments yet: the parent replays it)
and a JSON file of notes, errors and counts.
"""

from __future__ import annotations

import json
import os
import pickle
import runpy
import sys
import threading
import time
import traceback
import warnings


def main(spec_path: str) -> int:
    with open(spec_path) as handle:
        spec = json.load(handle)
    import torch
    from torch._subclasses.fake_tensor import (DynamicOutputShapeException, FakeTensor,
                                               FakeTensorMode, UnsupportedOperatorException,
                                               unset_fake_temporarily)

    from ..alloc.torch_model import parse_config
    from ..profile.tensor_recorder import TensorRecorder
    from . import attention, device_api
    from .answers import SELECTING, Answers
    from .kernel_rules import KernelRules
    from .shadows import Shadows
    from .targets import target as find_target

    target = find_target(spec["gpu"], spec["device"])
    flavour = "npu" if target.device == "npu" else "cuda"
    config = parse_config(spec["settings"], flavour)
    live = device_api.LiveModel(config)
    recorder = TensorRecorder(max_events=spec.get("max_events", 50_000_000), stacks=True)
    answers = Answers(spec.get("assume"))
    rules = KernelRules(target)
    shadows = Shadows(torch, FakeTensor, unset_fake_temporarily)
    result = {"ops": 0, "unsupported": {}, "notes": [], "error": None, "empty_cache_us": []}
    is_cuda: dict = {}                      # recorder's device index -> a cuda device?

    def listener(action, key, size, device):
        cuda = is_cuda.get(device)
        if cuda is None:
            cuda = is_cuda[device] = recorder.devices[device].startswith(DEVICES)
        if cuda:
            live(action, key, size, device)

    recorder.listener = listener
    local_scalar = torch.ops.aten._local_scalar_dense.default
    counter = [0]


    spent = [0]                              # ns inside the operators (fake kernels and all)

    def intercept(func, args, kwargs, outputs):
        started = time.perf_counter_ns()
        try:
            return operator(func, args, kwargs, outputs)
        finally:
            spent[0] += time.perf_counter_ns() - started

    def operator(func, args, kwargs, outputs):
        counter[0] += 1
        if func is local_scalar:
            shadow = args[0] if not isinstance(args[0], FakeTensor) and args[0].device.type == "cpu" \
                else getattr(args[0], "_npumem_shadow", None)
            if shadow is None:
                return answers.scalar(args[0], torch)
            with unset_fake_temporarily():
                return shadow.item()
        name = func._schema.name.split("::", 1)[-1]
        real = shadows.real_inputs(args, kwargs)
        if real is not None and not real[2]:    # the host alone
            if shadows.small_on_host(args):
                real_out = shadows.run(func, *real[:2])
                if real_out is not None:
                    outputs(real_out)           # small: real values
                    return real_out
            real = None
        try:
            out = func(*args, **kwargs)
        except DynamicOutputShapeException:
            if name not in SELECTING:
                raise
            out = answers.selecting(name, args, torch)
        except UnsupportedOperatorException:
            result["unsupported"][name] = result["unsupported"].get(name, 0) + 1
            raise
        real_out = shadows.run(func, *real[:2]) if real is not None and shadows.small(out) else None
        if not func.is_view:                 # a view never allocates (fake views from
            outputs(out)                     # FakeTensorMode's cache may carry a new storage)
        if real_out is not None:
            shadows.attach(out, real_out)
        answers.remember(name, out, torch)
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.device.type == "cuda" or name == "convolution_backward":
            for size, label, temporary in rules.workspaces(func, args, kwargs):
                recorder.record_extra(size, first.device if isinstance(first, torch.Tensor) else "cuda:0",
                                      label, temporary)
        return out

    recorder.intercept = intercept

    chosen: dict = {}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if isinstance(query, torch.Tensor) and query.device.type == "cuda":
            backend = attention.choose(target, torch, query, key, value, attn_mask, dropout_p,
                                       is_causal, enable_gqa)
            chosen[backend] = chosen.get(backend, 0) + 1
            if backend != attention.MATH:
                return attention.run(backend, torch, query, key, value, attn_mask, dropout_p,
                                     is_causal, scale)
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    # the module attribute, which nn.MultiheadAttention and transformers look up at each call
    torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention

    def swap_tensors(t1, t2, _swap=torch.utils.swap_tensors):
        # Module.to() swaps each fake parameter for a new one, which fails on the weak
        # references fake tensors carry and unties tied weights; a real run sets .data in place
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor):
            try:
                with torch.no_grad():
                    t1.data = t2
                t1.fake_device = t2.fake_device
            except RuntimeError:                 # cpu -> npu (PrivateUse1): no shallow copy
                torch._C._swap_tensor_impl(t1, t2)   # swap_tensors less its weak-reference check
                t1.__dict__, t2.__dict__ = t2.__dict__, t1.__dict__
            return
        _swap(t1, t2)

    # FakeTensorMode computes one-element constants for real, on their device: the shadows do
    # that here (on the host), for every small tensor
    torch._subclasses.fake_tensor.CONSTANT_NUMEL_LIMIT = 0
    torch.utils.swap_tensors = swap_tensors
    to_numpy, to_list = torch.Tensor.numpy, torch.Tensor.tolist

    def numpy(self, *args, **kwargs):
        if isinstance(self, FakeTensor) and self.device.type != "cpu":     # as on a GPU
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        if isinstance(self, FakeTensor):
            return answers.placeholder(self, torch, unset_fake_temporarily, as_list=False)
        return to_numpy(self, *args, **kwargs)

    def tolist(self):
        if isinstance(self, FakeTensor):
            return answers.placeholder(self, torch, unset_fake_temporarily, as_list=True)
        return to_list(self)

    torch.Tensor.numpy, torch.Tensor.tolist = numpy, tolist
    # optimizers take their foreach (multi-tensor) path for plain tensors on a GPU; a fake
    # tensor's type is not on their list, which would send them down the per-tensor path
    from torch.optim import optimizer as optimizers
    if FakeTensor not in optimizers._foreach_supported_types:
        optimizers._foreach_supported_types.append(FakeTensor)
    torch.nn.modules.module.torch.utils.swap_tensors = swap_tensors

    def on_empty_cache():
        result["empty_cache_us"].append((time.perf_counter_ns() - recorder.started_ns) / 1000.0)

    def on_dump(path=None):
        from .predicted import predicted_snapshot
        snapshot = predicted_snapshot(_cuda_only(recorder.snapshot(), result["empty_cache_us"]), config)
        if path is None:
            return snapshot
        with open(path, "wb") as handle:
            pickle.dump(snapshot, handle)

    if target.device == "npu":                 # PrivateUse1's hooks, before the first npu tensor
        import ctypes
        ctypes.CDLL(spec["library"]).npumem_stand_in_npu()
    device_api.install(torch, target, live, spec.get("devices", 1), on_empty_cache, on_dump)

    sys.meta_path.insert(0, _EagerLibraries())
    # PyTorch warns when code reads a fake tensor's data pointer (nn.Module's fast-path checks do)
    warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
    sys.argv = [spec["script"], *spec["args"]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(spec["script"])))
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    started = time.perf_counter()
    status = 0
    with fake:
        recorder.start()
        try:
            runpy.run_path(spec["script"], run_name="__main__")
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:              # the script failed under fake tensors
            result["error"] = _describe_failure(exc, spec["script"])
            if os.environ.get("NPUMEM_ESTIMATE_TRACEBACK"):
                traceback.print_exc()
            status = 1
        finally:
            recorder.stop()
    result["seconds"] = time.perf_counter() - started
    result["ops"] = counter[0]
    result["op_seconds"] = spent[0] / 1e9
    result["attention"] = chosen
    result["answers"] = answers.notes()
    result["bounded_convolutions"] = sum(rules.bounded.values())
    result["table_source"] = rules.table_source
    result["threads"] = threading.active_count()
    snapshot = _cuda_only(recorder.snapshot(), result["empty_cache_us"])
    with open(spec["out"] + ".partial", "wb") as handle:
        pickle.dump(snapshot, handle)
    os.replace(spec["out"] + ".partial", spec["out"])
    result["status"] = status
    with open(spec["out"] + ".json", "w") as handle:
        json.dump(result, handle)
    return 0


class _EagerLibraries:
    """A finder that patches libraries which run differently on fake tensors once imported:
    transformers counts a fake tensor as tracing (import_utils.is_fake_tensor) and then keeps
    the attention masks and paths it drops on a GPU, which changes the attention kernel."""

    PATCHES = {"transformers.utils.import_utils": {"is_fake_tensor": lambda x: False}}

    def find_spec(self, name, path=None, target=None):
        if name not in self.PATCHES:
            return None
        import importlib.util
        sys.meta_path.remove(self)              # the normal finders, then put back
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        load, patches = spec.loader.exec_module, self.PATCHES[name]

        def exec_module(module):
            load(module)
            for attribute, value in patches.items():
                setattr(module, attribute, value)
        spec.loader.exec_module = exec_module
        return spec


def _cuda_only(snapshot: dict, empty_cache_us: list) -> dict:
    """The recorder's snapshot with the device traces of cuda devices alone (by index), and
    each empty_cache() as the segment_free that npumem's replay reads as one."""
    devices = snapshot["npumem"]["devices"]
    traces: list = []
    for name, trace in zip(devices, snapshot["device_traces"]):
        if not name.startswith(DEVICES):
            continue
        index = int(name.split(":")[1]) if ":" in name else 0
        while len(traces) <= index:
            traces.append([])
        traces[index] = trace
    if not traces:
        traces = [[]]
    for when in empty_cache_us:
        for trace in traces:
            at = next((i for i, entry in enumerate(trace) if entry["time_us"] > when), len(trace))
            trace.insert(at, {"action": "segment_free", "addr": 0, "size": 0, "stream": 0,
                              "time_us": when, "frames": []})
    annotations = [a for a in snapshot.get("external_annotations", [])
                   if a.get("device", 0) < len(devices) and devices[a["device"]].startswith(DEVICES)]
    return {**snapshot, "device_traces": traces, "external_annotations": annotations}


DEVICES = ("cuda", "npu")              # the device types estimated (npu: --device npu)


def _describe_failure(exc: BaseException, script: str) -> dict:
    """The exception, the operator it names (fake tensor errors carry it) and the script's
    line that reached it (the last frame in the user's file)."""
    frames = traceback.extract_tb(exc.__traceback__)
    library = (os.path.dirname(os.__file__), "site-packages", f"{os.sep}npumem{os.sep}", "<frozen")
    user = [f for f in frames if not any(part in f.filename for part in library)] or \
        [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(script)]
    where = user[-1] if user else (frames[-1] if frames else None)
    operator = getattr(exc, "func", None)
    message = str(exc).splitlines()[0][:500] if str(exc) else ""
    if "DispatchStub: missing kernel for cuda" in str(exc):
        message = ("PyTorch has no fake-device path for this operator (a kernel reached only "
                   "through a CUDA dispatch stub, as cuDNN RNNs are: nn.LSTM, nn.GRU, nn.RNN)")
    return {"type": type(exc).__name__, "message": message,
            "operator": str(operator) if operator is not None else None,
            "file": where.filename if where else None, "line": where.lineno if where else None,
            "code": where.line if where else None}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
