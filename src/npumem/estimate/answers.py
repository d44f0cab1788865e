"""Answers for the questions a fake run cannot answer: values (`.item()`, `bool(tensor)`) and
output sizes that depend on data (`nonzero`, `masked_select`).

A scalar's answer depends on the operator that made it, so that common checks take the branch
a healthy run takes: `all()` and `isfinite` are True (an attention mask of ones: no padding),
`any()`, `isnan` and `isinf` are False (no bad values, so GradScaler steps); other booleans are False, integers
1 (a count a script may divide by) and floats 0.0 (a loss to print, GradScaler's found_inf).
`--assume bool=True,int=8,float=1.5` changes the defaults, and `--assume FILE:LINE=VALUE` the
value read at one line. A value the user gave is theirs; one estimate assumed is handed out
marked (decisions.py), so that a branch taken on it makes the estimate uncertain. Sizes that
depend on data take their largest value (every element selected): a memory estimate should
not be short.
"""

from __future__ import annotations

import math
import os
from collections import Counter

from .decisions import Origin, mark, user_site

TRUE_OPS = {"all", "isfinite"}
FALSE_OPS = {"any", "isnan", "isinf", "isneginf", "isposinf"}
SELECTING = {"nonzero", "masked_select", "argwhere"}


class Answers:
    def __init__(self, assume: dict | None = None):
        assume = assume or {}
        self.defaults = {"bool": bool(assume.get("bool", False)), "int": int(assume.get("int", 1)),
                         "float": float(assume.get("float", 0.0))}
        self.chosen = {kind for kind in self.defaults if kind in assume}   # given by the user
        self.at_lines = dict(assume.get("lines", {}))   # "FILE:LINE" -> the value read there
        self.lines_used: Counter = Counter()
        self.given: Counter = Counter()     # what was answered: (kind, op) -> count
        self.notes_seen: Counter = Counter()   # other things the fake run did in place of the script
        self.unmodelled_seen: Counter = Counter()   # what -> calls
        self.assumed = 0                    # values assumed so far (decisions.py marks them)
        self.last_origin: Origin | None = None
        self.decisions = None               # decisions.install() hands over its Decisions

    def note(self, text: str) -> None:
        self.notes_seen[text] += 1

    def unmodelled(self, text: str) -> None:
        """Work the estimate does not model: said in the verdict line, never only in a note."""
        self.unmodelled_seen[text] += 1

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
        site = user_site()
        given = self._at_line(site)
        if given is not None:
            return {"bool": bool, "int": int, "float": float}[kind](given)
        self.given[kind, made_by or "?"] += 1
        if kind not in self.chosen or made_by in TRUE_OPS | FALSE_OPS:
            self._assume(Origin(kind, made_by, value, site))
        return value

    def random(self, tensor, value, torch):
        """A value the CPU shadow drew for the device's random numbers: real, but a GPU draws
        another, so it counts as assumed (the user's value for the line, where given)."""
        site = user_site()
        given = self._at_line(site)
        if given is not None:
            return type(value)(given)
        self._assume(Origin("random", getattr(tensor, "_npumem_made_by", ""), value, site))
        return value

    def _assume(self, origin: Origin) -> None:
        self.assumed += 1
        self.last_origin = origin

    def _at_line(self, site: tuple[str, int]):
        """The value the user gave for the line `site` reads (--assume FILE:LINE=VALUE)."""
        if not self.at_lines:
            return None
        file, line = site
        for key, value in self.at_lines.items():
            name, _, number = key.rpartition(":")
            if number == str(line) and (file == os.path.abspath(name) or
                                        file.endswith(os.sep + name.lstrip("./"))):
                self.lines_used[key] += 1
                return value
        return None

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
        values where it has one; the user's value for the line, with --assume FILE:LINE=V): a
        script that reads results on the host runs on, and what it decides on them is told."""
        import numpy
        shadow = getattr(tensor, "_npumem_shadow", None)
        with unset_fake():
            if shadow is not None:
                return shadow.tolist() if as_list else shadow.numpy()
            try:
                dtype = torch.empty((), dtype=tensor.dtype).numpy().dtype
            except TypeError:                   # bfloat16 and others numpy lacks
                dtype = numpy.float32
        site = user_site()
        given = self._at_line(site)
        values = numpy.full(tuple(tensor.shape), 0 if given is None else given, dtype=dtype)
        values = values.tolist() if as_list else values
        if given is not None:
            return values
        kind = "tolist" if as_list else "numpy"
        self.given["placeholder", kind] += 1
        origin = Origin(kind, "", 0, site)
        self._assume(origin)
        if dtype == numpy.bool_ and self.decisions is not None:
            self.decisions.record(origin, "booleans read from the device")
        return mark(values, origin)

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
                given = kind in self.chosen and op not in TRUE_OPS | FALSE_OPS
                lines.append(f"{count} x {kind} value of {made}: "
                             f"{'given' if given else 'assumed'} {value}")
        return lines
