"""Answers for the questions a fake run cannot answer: values (`.item()`, `bool(tensor)`) and
output sizes that depend on data (`nonzero`, `masked_select`).

A scalar's answer depends on the operator that made it, so that common checks take the branch
a healthy run takes: `all()` and `isfinite` are True (an attention mask of ones: no padding),
`any()`, `isnan` and `isinf` are False (no bad values, so GradScaler steps); other booleans are False, integers
1 (a count a script may divide by) and floats 0.0 (a loss to print, GradScaler's found_inf).
`--assume bool=True,int=8,float=1.5` changes the defaults. Sizes that depend on data take
their largest value (every element selected): a memory estimate should not be short.
"""

from __future__ import annotations

import math
from collections import Counter

TRUE_OPS = {"all", "isfinite"}
FALSE_OPS = {"any", "isnan", "isinf", "isneginf", "isposinf"}
SELECTING = {"nonzero", "masked_select", "argwhere"}


class Answers:
    def __init__(self, assume: dict | None = None):
        assume = assume or {}
        self.defaults = {"bool": bool(assume.get("bool", False)), "int": int(assume.get("int", 1)),
                         "float": float(assume.get("float", 0.0))}
        self.given: Counter = Counter()     # what was answered: (kind, op) -> count
        self.notes_seen: Counter = Counter()   # other things the fake run did in place of the script

    def note(self, text: str) -> None:
        self.notes_seen[text] += 1

    def _bool(self, op: str) -> bool:
        return True if op in TRUE_OPS else False if op in FALSE_OPS else self.defaults["bool"]

    def remember(self, name: str, out, torch) -> None:
        """Note the operator that made a one-element result (its answer depends on it)."""
        if isinstance(out, torch.Tensor) and out.dim() == 0:
            try:
                out._npumem_made_by = name
            except AttributeError:
                pass

    def scalar(self, tensor, torch):
        made_by = getattr(tensor, "_npumem_made_by", "")
        if tensor.dtype == torch.bool:
            value, kind = self._bool(made_by), "bool"
        elif tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            value, kind = self.defaults["float"], "float"
        else:
            value, kind = self.defaults["int"], "int"
        self.given[kind, made_by or "?"] += 1
        return value

    def dynamic(self, name: str, func, args, kwargs, torch):
        """The output of an operator whose size depends on data, at its largest: a selection
        selects every element, `x[mask]` takes every position, `unique` finds every element
        distinct. None for other operators."""
        if name in SELECTING:
            return self.selecting(name, args, torch)
        if name == "index" and len(args) > 1:
            indices = []
            for index in args[1]:
                if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                    positions = self.selecting("nonzero", [index], torch)
                    indices += [positions[:, d] for d in range(index.dim())]
                else:
                    indices.append(index)
            return func(args[0], indices, **kwargs)
        if name in ("_unique2", "unique_consecutive", "unique_dim"):
            source = args[0]
            self.given["size", name] += 1
            flags = [*args[1:], *kwargs.values()]
            inverse, counts = (bool(flags[-2]), bool(flags[-1])) if len(flags) >= 2 else (False, False)
            values = torch.empty(source.numel(), dtype=source.dtype, device=source.device)
            return (values,
                    torch.empty(source.shape if inverse else (0,), dtype=torch.long, device=source.device),
                    torch.empty(source.numel() if counts else 0, dtype=torch.long, device=source.device))
        return None

    def selecting(self, name: str, args, torch):
        """The output of a selection when every element is selected."""
        source = args[0]
        self.given["size", name] += 1
        if name == "masked_select":
            count = math.prod(torch.broadcast_shapes(source.shape, args[1].shape))
            return torch.empty(count, dtype=source.dtype, device=source.device)
        return torch.empty((source.numel(), source.dim()), dtype=torch.long, device=source.device)

    def placeholder(self, tensor, torch, unset_fake, as_list: bool):
        """Zeros of the tensor's shape for `.numpy()` or `.tolist()` of a fake tensor (its shadow's
        values where it has one): a script that reads results on the host runs on."""
        import numpy
        shadow = getattr(tensor, "_npumem_shadow", None)
        with unset_fake():
            if shadow is not None:
                return shadow.tolist() if as_list else shadow.numpy()
            try:
                dtype = torch.empty((), dtype=tensor.dtype).numpy().dtype
            except TypeError:                   # bfloat16 and others numpy lacks
                dtype = numpy.float32
        self.given["placeholder", "tolist" if as_list else "numpy"] += 1
        zeros = numpy.zeros(tuple(tensor.shape), dtype=dtype)
        return zeros.tolist() if as_list else zeros

    def notes(self) -> list[str]:
        """What the fake run did in place of the script, then what it assumed."""
        return [f"{count} x {text}" if count > 1 else text
                for text, count in self.notes_seen.items()] + self.assumptions()

    def assumptions(self) -> list[str]:
        lines = []
        for (kind, op), count in sorted(self.given.items()):
            if kind == "placeholder":
                lines.append(f"{count} x {op}() of a device result: zeros of its shape")
            elif kind == "size":
                what = "distinct" if "unique" in op else "selected"
                lines.append(f"{count} x {op}: assumed every element {what} (the largest output)")
            else:
                value = self._bool(op) if kind == "bool" else self.defaults[kind]
                made = f"{op}()" if op != "?" else "a tensor"
                lines.append(f"{count} x {kind} value of {made}: assumed {value}")
        return lines
