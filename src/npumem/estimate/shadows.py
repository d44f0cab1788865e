"""Real values for the small tensors of a fake run, so that a script's arithmetic on them holds.

A fake tensor has no values, yet scripts and PyTorch itself read some: AdamW's step count is a
one-element tensor on the GPU whose `.item()` divides a bias correction, a scheduler keeps its
learning rate in one, transformers checks whether an attention mask is all ones. Each small
tensor (at most SMALL elements, as the fake result's shape says) gets a shadow: a real CPU
tensor computed by running the same operator on the shadows of its inputs. Host tensors that
small are simply real. `.item()` then reads the shadow; only tensors too large to shadow, or
made from such, fall back to answers.py.
"""

from __future__ import annotations

import math

SMALL = 4096            # elements


class Shadows:
    def __init__(self, torch, fake_type, unset_fake):
        self.torch, self.fake_type, self.unset_fake = torch, fake_type, unset_fake

    def real_inputs(self, args, kwargs):
        """(args, kwargs, device_involved) with each tensor replaced by its real value, or None
        where some input has none (a large or unshadowed fake tensor)."""
        torch, fake_type = self.torch, self.fake_type
        on_device = [False]

        def real(value):
            if isinstance(value, torch.Tensor):
                if isinstance(value, fake_type):
                    shadow = getattr(value, "_npumem_shadow", None)
                    if shadow is None:
                        raise LookupError
                    if value.device.type != "cpu":
                        on_device[0] = True
                    return shadow
                if value.numel() > SMALL:
                    raise LookupError
                if value.device.type != "cpu":      # made by the stand-in device's kernels
                    on_device[0] = True
                    with self.unset_fake():
                        return torch.ops.npumem.host_copy(value)
                return value
            if isinstance(value, (list, tuple)):
                return type(value)(real(v) for v in value)
            if isinstance(value, torch.device) and value.type != "cpu":
                on_device[0] = True
                return torch.device("cpu")
            return value

        try:
            real_args = [real(a) for a in args]
            real_kwargs = {k: real(v) for k, v in kwargs.items()}
        except LookupError:
            return None
        device = kwargs.get("device")
        if device is not None and torch.device(device).type != "cpu":
            on_device[0] = True
            real_kwargs["device"] = torch.device("cpu")
        if "pin_memory" in real_kwargs:
            real_kwargs["pin_memory"] = False
        return real_args, real_kwargs, on_device[0]

    def small_on_host(self, args) -> bool:
        """Whether a host operator on small real inputs makes a small result, told before running
        it (FakeTensorMode would run it for real on real inputs, so it cannot be asked first):
        a factory's size list, else its largest integer (arange(n), randperm(n))."""
        if any(isinstance(a, self.torch.Tensor) for a in args):
            return True
        for value in args:
            if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
                return math.prod(value) <= SMALL
        return all(v <= SMALL for v in args if isinstance(v, int) and not isinstance(v, bool))

    def absorbed(self, name: str, args, out):
        """A result known without all its inputs: `a & b`, `a * b` with a known all-zero
        operand is all zeros, `a | b` with a known all-true one all true (generation loops end
        on `unfinished & ~stopping(...)`, whose second operand is known). None otherwise."""
        torch = self.torch
        absorbing = {"bitwise_and": 0, "logical_and": 0, "mul": 0, "bitwise_or": 1, "logical_or": 1}
        value = absorbing.get(name)
        if value is None or not isinstance(out, torch.Tensor) or out.numel() > SMALL:
            return None
        for arg in args[:2]:
            shadow = getattr(arg, "_npumem_shadow", None) if isinstance(arg, self.fake_type) else (
                arg if isinstance(arg, torch.Tensor) and arg.device.type == "cpu" else None)
            if shadow is None or shadow.numel() == 0:
                continue
            with self.unset_fake():
                if bool((shadow == value).all()) if value else not bool(shadow.any()):
                    return torch.full(tuple(out.shape), value, dtype=out.dtype)
        return None

    def fake_like(self, real_out, args):
        """Fake tensors shaped as a real result, on the device of the first fake input: a size
        that depends on data, known because the inputs' values are (small[small > 0])."""
        torch = self.torch
        device = next((a.device for a in args if isinstance(a, self.fake_type)), torch.device("cpu"))
        if isinstance(real_out, (list, tuple)):
            return type(real_out)(self.fake_like(item, args) for item in real_out)
        if not isinstance(real_out, torch.Tensor):
            return real_out
        return torch.empty_strided(tuple(real_out.shape), real_out.stride(), dtype=real_out.dtype,
                                   device=device)

    def small(self, out) -> bool:
        """Whether every tensor `out` holds is small enough to shadow (the fake result says)."""
        items = out if isinstance(out, (list, tuple)) else (out,)
        return all(item.numel() <= SMALL for item in items if isinstance(item, self.torch.Tensor))

    def run(self, func, real_args, real_kwargs):
        """The operator on real inputs, or None where it cannot run on the host."""
        with self.unset_fake():
            try:
                out = func(*real_args, **real_kwargs)
            except Exception:               # a device-only operator; no values then
                return None
        return out

    def attach(self, out, real_out) -> None:
        torch = self.torch
        if isinstance(out, torch.Tensor) and isinstance(real_out, torch.Tensor):
            if out.numel() <= SMALL and isinstance(out, self.fake_type):
                out._npumem_shadow = real_out
        elif isinstance(out, (list, tuple)) and isinstance(real_out, (list, tuple)):
            for item, real in zip(out, real_out):
                self.attach(item, real)
