"""What a fake run changes in PyTorch (and transformers) so that a script takes the path it
takes on a GPU, each change beside the reason for it. `prepare()` installs them all."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

from . import attention
from .versions import Modelled


def prepare(torch, target, answers, versions: Modelled | None = None) -> dict:
    """Install every change; returns the attention kernels chosen, as they are (backend ->
    calls, and "note" where the modelled PyTorch has no attention rules of its own).
    `versions`: the PyTorch and cuDNN the estimate models (versions.Modelled.from_spec), by
    default the installed PyTorch and the stand-in's cuDNN."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    chosen: dict = {}
    if target.device == "cuda":             # on an NPU: the math path (not modelled further)
        _attention(torch, target, chosen, versions or Modelled.from_spec())
    _parameters_moved_in_place(torch, FakeTensor)
    _host_reads(torch, FakeTensor, unset_fake_temporarily, answers)
    _no_files_written(torch, answers)
    _compile_runs_eagerly(torch, answers)
    _record_stream_noted(torch, answers)
    _host_side_data_loading(torch, answers)
    # FakeTensorMode computes one-element constants for real, on their device: the shadows do
    # that here (on the host), for every small tensor
    torch._subclasses.fake_tensor.CONSTANT_NUMEL_LIMIT = 0
    _one_fake_mode(torch)
    # optimizers take their foreach (multi-tensor) path for plain tensors on a GPU; a fake
    # tensor's type is not on their list, which would send them down the per-tensor path
    from torch.optim import optimizer as optimizers
    if FakeTensor not in optimizers._foreach_supported_types:
        optimizers._foreach_supported_types.append(FakeTensor)
    # warnings about the fake run itself, not the script: PyTorch's when code reads a fake
    # tensor's data pointer (nn.Module's fast-path checks do), the CPU build's cuDNN and hooks
    for message in ("Accessing the data pointer of FakeTensor", "PyTorch was compiled without cuDNN",
                    ".*global hooks on modules"):
        warnings.filterwarnings("ignore", message=message)
    sys.meta_path.insert(0, _EagerLibraries())
    return chosen


def _attention(torch, target, chosen: dict, versions: Modelled) -> None:
    """scaled_dot_product_attention runs the kernel the target would pick for the modelled
    versions (a fake run, with no GPU to ask, falls back to the math path). The module attribute
    is replaced, which nn.MultiheadAttention and transformers look up at each call.

    Under autocast the choice sees what the GPU's does: scaled_dot_product_attention is on
    autocast's lower-precision list for CUDA (autocast_mode.cpp), so every floating input but
    float64, the mask included, is cast to the autocast dtype before select_sdp_backend runs."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    note = attention.rule_set(versions)[1]
    if note:
        chosen["note"] = note

    def autocast(tensors):
        if not torch.is_autocast_enabled("cuda"):
            return tensors
        dtype = torch.get_autocast_dtype("cuda")
        return [t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.device.type == "cuda" and t.dtype != torch.float64 else t for t in tensors]

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if not (isinstance(query, torch.Tensor) and query.device.type == "cuda") or query.is_nested:
            # nested inputs take PyTorch's own path (the jagged layout its Python selection)
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        query, key, value, attn_mask = autocast([query, key, value, attn_mask])
        q, k, v, mask, unbatched = attention.normalize(versions, query, key, value, attn_mask)
        backend = attention.choose(target, torch, q, k, v, mask, dropout_p, is_causal,
                                   enable_gqa, versions)
        chosen[backend] = chosen.get(backend, 0) + 1
        if backend == "error":               # select_sdp_backend's TORCH_CHECK
            raise RuntimeError("No available kernel. Aborting execution.")
        if backend == attention.MATH:
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        # the fused operator is below autocast on a GPU: its inputs are cast already
        with torch.autocast("cuda", enabled=False) if torch.is_autocast_enabled("cuda") \
                else contextlib.nullcontext():
            out = attention.run(backend, torch, q, k, v, mask, dropout_p, is_causal, scale)
        return out.squeeze(0) if unbatched else out

    torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention
    from ..profile.stacks import pass_through
    pass_through(__file__, attention.__file__)   # the user's line stays on what these allocate


def _one_fake_mode(torch) -> None:
    """copy.deepcopy of a module (nn.TransformerEncoder clones its layer so) copies each fake
    tensor's attributes, its FakeTensorMode among them: the copies keep the one mode (the
    operator cache answers for its own mode's tensors)."""
    torch._subclasses.fake_tensor.FakeTensorMode.__deepcopy__ = lambda mode, memo: mode


def _parameters_moved_in_place(torch, fake_type) -> None:
    """Module.to() keeps each parameter object, as a GPU run does (tied weights stay tied): it
    is told to swap (set_swap_module_params_on_conversion), and the swap here puts the moved
    tensor into the parameter's object: by .data for two fake tensors, else (a real parameter
    loaded from a file, or cpu -> npu) by swapping the objects' contents, as
    torch.utils.swap_tensors does but without its refusal of weak references, which fake
    tensors carry."""
    swap = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        if not isinstance(t2, fake_type):
            return swap(t1, t2)
        if isinstance(t1, fake_type):
            try:
                with torch.no_grad():
                    t1.data = t2
                t1.fake_device = t2.fake_device
                return
            except RuntimeError:                 # no shallow copy between these devices
                pass
        t1.__class__, t2.__class__ = t2.__class__, t1.__class__
        t1.__dict__, t2.__dict__ = t2.__dict__, t1.__dict__
        torch._C._swap_tensor_impl(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    torch.__future__.set_swap_module_params_on_conversion(True)


def _host_reads(torch, fake_type, unset_fake, answers) -> None:
    """`.numpy()` and `.tolist()` of a fake result: its shadow's values, else zeros of its shape
    (answers.placeholder); `.numpy()` of a device tensor fails as it does on a GPU. A
    one-element fake tensor formats (f"{loss:.4f}") as its value."""
    to_numpy, to_list = torch.Tensor.numpy, torch.Tensor.tolist

    def numpy(self, *args, **kwargs):
        if isinstance(self, fake_type) and self.device.type != "cpu":
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        if isinstance(self, fake_type):
            return answers.placeholder(self, torch, unset_fake, as_list=False)
        return to_numpy(self, *args, **kwargs)

    def tolist(self):
        if isinstance(self, fake_type):
            return answers.placeholder(self, torch, unset_fake, as_list=True)
        return to_list(self)

    def format_value(self, spec):
        # PyTorch formats a one-element tensor by its value for plain tensors only
        # (f"{loss:.4f}"); a fake one gives its value as .item() does: its shadow, or the answer
        if self.dim() == 0:
            return self.detach().item().__format__(spec)
        return object.__format__(self, spec)

    torch.Tensor.numpy, torch.Tensor.tolist = numpy, tolist
    fake_type.__format__ = format_value


def _no_files_written(torch, answers) -> None:
    """torch.save of fake tensors would write a broken file over the user's checkpoint: a fake
    run writes none, and keeps the object, which torch.load of the same path in this run returns.
    torch.load onto the device loads on the host and moves each tensor there as a fake one, so
    that the device's copy is counted (PyTorch's own path makes it outside any dispatch)."""
    saved: dict = {}
    load = torch.load

    def name_of(f) -> str | None:
        return os.path.abspath(os.fspath(f)) if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__") \
            else None

    def save(obj, f, *args, **kwargs):
        name = name_of(f)
        if name is not None:
            saved[name] = obj
        answers.note(f"torch.save to {os.fspath(f) if name else 'a file object'}: not written "
                     "(kept in memory for a torch.load of it)")

    def load_(f, map_location=None, *args, **kwargs):
        name = name_of(f)
        if name in saved:
            answers.note(f"torch.load of {os.fspath(f)}: what this run saved there")
            return saved[name]
        device = _device_of(torch, map_location)
        if device is None:
            return load(f, map_location, *args, **kwargs)
        moved: dict = {}                         # tensors that share a storage stay shared

        def to_device(value):
            if isinstance(value, torch.Tensor):
                key = id(value)
                if key not in moved:
                    moved[key] = value.to(device)
                return moved[key]
            if isinstance(value, dict):
                return type(value)((k, to_device(v)) for k, v in value.items())
            if isinstance(value, (list, tuple)):
                return type(value)(to_device(v) for v in value)
            return value
        return to_device(load(f, "cpu", *args, **kwargs))

    torch.save, torch.load = save, load_


def _compile_runs_eagerly(torch, answers) -> None:
    """torch.compile would trace fake tensors through dynamo and Inductor, whose kernels'
    buffers are not modelled: the model runs as written, and a note says so."""
    def compile(model=None, *args, **kwargs):
        answers.unmodelled("torch.compile (Inductor's buffers and CUDA graph pools: the model "
                           "ran eagerly)")
        if model is None:                        # used as @torch.compile(...)
            return lambda fn: fn
        return model

    torch.compile = compile


def _record_stream_noted(torch, answers) -> None:
    """Tensor.record_stream keeps a freed block from its pool until the other stream's work is
    done: streams are not timed here, so the block is reused at once (said in the verdict)."""
    def record_stream(self, stream) -> None:
        answers.unmodelled("record_stream (blocks another stream uses are taken back at once)")

    torch.Tensor.record_stream = record_stream


def _device_of(torch, map_location):
    """The device a map_location sends tensors to, where it is a device (cuda, npu); else None."""
    if isinstance(map_location, dict):
        targets = {str(v) for v in map_location.values()}
        map_location = targets.pop() if len(targets) == 1 else None
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return device if device.type != "cpu" else None
    return None


def _host_side_data_loading(torch, answers) -> None:
    """DataLoader workers and pinned host memory cost no device memory, and fake tensors cannot
    cross into worker processes or be pinned: loading runs in the script's process, unpinned."""
    loader = torch.utils.data.DataLoader
    init = loader.__init__

    def __init__(self, *args, **kwargs):
        if kwargs.get("num_workers") or kwargs.get("pin_memory"):
            answers.note("DataLoader: num_workers=0 and pin_memory=False (host-side only)")
        kwargs["num_workers"], kwargs["pin_memory"] = 0, False
        kwargs.pop("prefetch_factor", None)
        kwargs.pop("persistent_workers", None)
        init(self, *args, **kwargs)

    loader.__init__ = __init__
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self


def _not_tracing(module) -> None:
    """transformers counts a fake tensor as tracing (is_fake_tensor) and then keeps the
    attention masks and paths it drops on a GPU, which changes the attention kernel."""
    module.is_fake_tensor = lambda x: False


def _safetensors_on_host(module) -> None:
    """safetensors builds device tensors outside any dispatch (the stand-in device cannot hold
    them): it loads on the host, and the tensors move to the device as fake ones."""
    load_file = module.load_file

    def load_on_host(filename, device="cpu"):
        tensors = load_file(filename, device="cpu")
        if str(device) == "cpu":
            return tensors
        return {name: tensor.to(device) for name, tensor in tensors.items()}

    module.load_file = load_on_host


class _EagerLibraries:
    """A finder that patches libraries which run differently on fake tensors, once imported."""

    PATCHES = {"transformers.utils.import_utils": _not_tracing, "safetensors.torch": _safetensors_on_host}

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
        load, patch = spec.loader.exec_module, self.PATCHES[name]

        def exec_module(module):
            load(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec
