"""Answers for the questions a fake run cannot answer: values (`.item()`, `bool(tensor)`) and
output sizes that depend on data (`nonzero`, `masked_select`).

A scalar's answer depends on the operator that made it, so that common checks take the branch
a healthy run takes: `all()` is True (an attention mask of ones: no padding), `any()`, `isnan`
and `isinf` are False (no bad values, so GradScaler steps); other booleans are False, integers
1 (a count a script may divide by) and floats 0.0 (a loss to print, GradScaler's found_inf).
`--assume bool=True,int=8,float=1.5` changes the defaults. Sizes that depend on data take
their largest value (every element selected): a memory estimate should not be short.
"""

from __future__ import annotations

TRUE_OPS = {"all"}
FALSE_OPS = {"any", "isnan", "isinf", "isneginf", "isposinf"}
SELECTING = {"nonzero", "masked_select", "argwhere"}


class Answers:
    def __init__(self, assume: dict | None = None):
        assume = assume or {}
        self.defaults = {"bool": bool(assume.get("bool", False)), "int": int(assume.get("int", 1)),
                         "float": float(assume.get("float", 0.0))}
        self.given: dict = {}               # what was answered: (kind, op) -> count

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
            value = True if made_by in TRUE_OPS else False if made_by in FALSE_OPS else self.defaults["bool"]
            kind = "bool"
        elif tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            value, kind = self.defaults["float"], "float"
        else:
            value, kind = self.defaults["int"], "int"
        key = (kind, made_by or "?")
        self.given[key] = self.given.get(key, 0) + 1
        return value

    def selecting(self, name: str, args, torch):
        """The output of a selection when every element is selected."""
        source = args[0]
        if name == "masked_select":
            shape = torch.broadcast_shapes(source.shape, args[1].shape)
            count = 1
            for dim in shape:
                count *= dim
            return torch.empty(count, dtype=source.dtype, device=source.device)
        count = source.numel()
        self.given[("size", name)] = self.given.get(("size", name), 0) + 1
        return torch.empty((count, source.dim()), dtype=torch.long, device=source.device)

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
        key = ("placeholder", "tolist" if as_list else "numpy")
        self.given[key] = self.given.get(key, 0) + 1
        zeros = numpy.zeros(tuple(tensor.shape), dtype=dtype)
        return zeros.tolist() if as_list else zeros

    def notes(self) -> list[str]:
        lines = []
        for (kind, op), count in sorted(self.given.items()):
            if kind == "placeholder":
                lines.append(f"{count} x {op}() of a device result: zeros of its shape")
            elif kind == "size":
                lines.append(f"{count} x {op}: assumed every element selected (the largest output)")
            else:
                value = True if op in TRUE_OPS else False if op in FALSE_OPS else self.defaults[kind]
                lines.append(f"{count} x {kind} value of {op}(): assumed {value}")
        return lines
