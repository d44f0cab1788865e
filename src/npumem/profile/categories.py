"""What each byte of a PyTorch program is for, told from what the program does with it.

The names are those of torch.profiler's memory timeline (its `Category`), lower case:
parameter, optimizer_state, gradient, input, activation (saved for backward), temporary; and
other for memory none of them describes (the timeline leaves it unlabelled).

- parameter: a module's parameters and buffers, seen at each module call;
- gradient: a parameter's `.grad`, when autograd accumulates it or an optimizer steps;
- optimizer_state: the tensors in an optimizer's `state` after its step;
- input: the tensors handed to the outermost module call;
- activation: tensors autograd saves for backward (a default saved-tensors hook);
- temporary: none of those, and freed in the step that made it (with no steps: freed);
- other: none of those, and alive across a step boundary or at the end.

A storage can be told several things (a parameter is also saved for backward): the first of
this order wins.
"""

from __future__ import annotations

import os
import sys
import threading

PARAMETER, OPTIMIZER_STATE, GRADIENT = "parameter", "optimizer_state", "gradient"
INPUT, ACTIVATION, TEMPORARY, OTHER = "input", "activation", "temporary", "other"
ORDER = (PARAMETER, OPTIMIZER_STATE, GRADIENT, INPUT, ACTIVATION, TEMPORARY, OTHER)
UNSET = ""                                 # not told; temporary or other once steps are known
_RANK = {name: rank for rank, name in enumerate(ORDER)}


def stronger(category: str, than: str | None) -> bool:
    return than is None or _RANK[category] < _RANK[than]


def install(torch, recorder) -> list:
    """The hooks that tell `recorder` categories and steps; returns what undoes them."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim

    seen_parameters: set = set()
    depth = threading.local()

    def accumulated(parameter):
        if parameter.grad is not None:
            recorder.categorize(parameter.grad, GRADIENT)

    def before_call(module, args):
        for parameter in module.parameters(recurse=False):
            recorder.categorize(parameter, PARAMETER)
            if parameter.grad is not None:
                recorder.categorize(parameter.grad, GRADIENT)
            if parameter.requires_grad and id(parameter) not in seen_parameters:
                seen_parameters.add(id(parameter))
                parameter.register_post_accumulate_grad_hook(accumulated)
        for buffer in module.buffers(recurse=False):
            recorder.categorize(buffer, PARAMETER)
        level = getattr(depth, "level", 0)
        if level == 0:
            for item in (*args, *_keyword_arguments(sys._getframe(1))):
                if isinstance(item, torch.Tensor):
                    recorder.categorize(item, INPUT)
        depth.level = level + 1

    def after_call(module, args, output):
        depth.level = max(getattr(depth, "level", 1) - 1, 0)

    def after_step(optimizer, args, kwargs):
        for state in optimizer.state.values():
            for value in state.values() if isinstance(state, dict) else ():
                if isinstance(value, torch.Tensor):
                    recorder.categorize(value, OPTIMIZER_STATE)
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    recorder.categorize(parameter.grad, GRADIENT)
        recorder.mark_step("optimizer.step")

    def saved(tensor):
        recorder.categorize(tensor, ACTIVATION)
        return tensor

    handles = [nn_module.register_module_forward_pre_hook(before_call),
               nn_module.register_module_forward_hook(after_call, always_call=True),
               optim.register_optimizer_step_post_hook(after_step)]
    undo = [handle.remove for handle in handles]
    torch._C._autograd._push_saved_tensors_default_hooks(saved, _unpacked)
    undo.append(torch._C._autograd._pop_saved_tensors_default_hooks)
    undo.append(_on_profiler_steps(torch, recorder))
    undo.append(_on_npumem_steps(recorder))
    return undo


_MODULE_FILE = os.path.join("torch", "nn", "modules", "module.py")


def _keyword_arguments(frame) -> tuple:
    """The keyword arguments of the module call a global forward pre-hook runs in (PyTorch
    hands such a hook the positional ones only): `model(input_ids=...)`, as transformers'
    models are called. Read from Module._call_impl's frame, once per outermost call."""
    if not frame.f_code.co_filename.endswith(_MODULE_FILE):     # _call_impl (or its inner)
        return ()
    kwargs = frame.f_locals.get("kwargs")
    return tuple(kwargs.values()) if isinstance(kwargs, dict) else ()


def _unpacked(tensor):
    return tensor


def _on_profiler_steps(torch, recorder):
    """torch.profiler.profile.step() marks a step too."""
    profile = torch.profiler.profile
    original = profile.step

    def step(self, *args, **kwargs):
        recorder.mark_step("torch.profiler")
        return original(self, *args, **kwargs)

    profile.step = step

    def undo():
        profile.step = original
    return undo


def _on_npumem_steps(recorder):
    from ..observe import STEP_LISTENERS

    def listener():
        recorder.mark_step("npumem.memory.step")

    STEP_LISTENERS.append(listener)
    return lambda: STEP_LISTENERS.remove(listener)


def name_unset(snapshot: dict) -> None:
    """Name the entries no hook told about: temporary when freed before the next step began,
    else other (alive across a step, or at the end). Steps are the snapshot's step annotations
    (`npumem_entry`, per device). A free carries its allocation's category."""
    for device, entries in enumerate(snapshot.get("device_traces") or []):
        starts = sorted(a["npumem_entry"] for a in snapshot.get("external_annotations") or []
                        if a.get("device") == device and "npumem_entry" in a)
        step, next_start, born = 0, 0, {}
        for index, entry in enumerate(entries):
            while next_start < len(starts) and starts[next_start] <= index:
                next_start += 1
                step += 1
            action = entry["action"]
            if action == "alloc":
                born[entry["addr"]] = (entry, step)
                continue
            alloc, alloc_step = (born.pop if action == "free_completed" else born.get)(
                entry["addr"], (None, None))
            if alloc is not None:
                if alloc["category"] == UNSET:
                    alloc["category"] = TEMPORARY if alloc_step == step else OTHER
                entry["category"] = alloc["category"]
        for alloc, _ in born.values():              # alive at the end
            if alloc["category"] == UNSET:
                alloc["category"] = OTHER
