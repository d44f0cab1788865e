"""Values a fake run made up, followed to where they decide the script's path.

A fake run cannot compute a large tensor's values: `.item()`, `bool(tensor)`, `.tolist()` and
`.numpy()` of one get an assumed answer (answers.py). Printing an assumed loss changes nothing;
branching on it (`if x.std().item() > 0.5:`, `while loss.item() > 0.01:`), or building a size
from it, can change what the script allocates. Each assumed value is handed out marked
(AssumedFloat, AssumedInt, AssumedArray); arithmetic keeps the mark, and the places where a
marked value decides something record a decision at the user's line:

- a comparison or truth test (`if`, `while`, `min`, `sorted` all come down to one), and
  math's and numpy's isnan, isinf and isfinite;
- a conversion to an integer (`int(x)`, `round(x)`: a count or a size in the making), and
  `range(n)` in the script's own file (a loop bound);
- a marked integer passed to a torch function that takes sizes (`torch.empty(n)`);
- `bool(tensor)` and `.item()` of a boolean tensor, decided where they are read.

An estimate with any decision is *uncertain* (exit status 3): each is named with its line and
the value assumed, and `--assume FILE:LINE=VALUE` gives the value read at that line.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field

from ..profile.analysis import is_library
from ..profile.stacks import is_internal_file


def inner_site() -> tuple[str, int] | None:
    """(file, line) of the innermost frame outside npumem: where a library decided, if one did."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not is_internal_file(name) and not name.startswith("<"):
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def user_site() -> tuple[str, int]:
    """(file, line) of the innermost frame of the user's own code (npumem's and the libraries'
    frames passed over)."""
    frame = sys._getframe(1)
    fallback = None
    while frame is not None:
        name = frame.f_code.co_filename
        if not is_library(name) and not name.startswith("<"):
            return name, frame.f_lineno
        if fallback is None and not name.startswith("<"):
            fallback = (name, frame.f_lineno)
        frame = frame.f_back
    return fallback or ("<unknown>", 0)


@dataclass
class Origin:
    """Where an assumed value came from: what made it, the value, the line that read it."""
    kind: str                       # bool, int, float, random; numpy / tolist for placeholders
    made_by: str                    # the operator that made the tensor ("" when unknown)
    value: object
    read_at: tuple[str, int]

    def describe(self) -> str:
        if self.kind in ("numpy", "tolist"):
            return f".{self.kind}() of a device result (zeros of its shape)"
        if self.kind == "random":
            made = f" of {self.made_by}()" if self.made_by else ""
            return f"value{made} drawn from the device's random numbers (a GPU draws others)"
        made = f"{self.made_by}()" if self.made_by else "a tensor"
        return f"{self.kind} value of {made}"


@dataclass
class Decision:
    file: str
    line: int
    how: str                        # what the value decided: "a comparison", "int()", ...
    origin: Origin
    inside: tuple[str, int] | None = None    # the library's line that decided, under the user's
    count: int = 0

    def as_dict(self) -> dict:
        read_file, read_line = self.origin.read_at
        inside = f"{library_path(self.inside[0])}:{self.inside[1]}" if self.inside else None
        return {"file": shown_path(self.file), "line": self.line, "code": self.code(),
                "assumed": _plain(self.origin.value), "what": self.origin.describe(),
                "how": self.how, "count": self.count, "inside": inside,
                "read_at": f"{shown_path(read_file)}:{read_line}"}

    def code(self) -> str:
        return linecache.getline(self.file, self.line).strip()


def shown_path(path: str) -> str:
    """A path as the user would name it: relative to the working folder where it is inside."""
    if os.path.isabs(path):
        relative = os.path.relpath(path)
        if not relative.startswith(".."):
            return relative
    return path


def library_path(path: str) -> str:
    """An installed library's file from its package folder on (transformers/generation/...)."""
    for mark in ("site-packages", "dist-packages"):
        if mark in path:
            return path.split(mark + os.sep, 1)[-1]
    return shown_path(path)


def _plain(value):
    for kind in (bool, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


@dataclass
class Decisions:
    """Every decision on an assumed value, one per (file, line, origin's line)."""
    seen: dict = field(default_factory=dict)

    def record(self, origin: Origin, how: str) -> None:
        file, line = user_site()
        key = (file, line, origin.read_at)
        decision = self.seen.get(key)
        if decision is None:
            inside = inner_site()
            decision = self.seen[key] = Decision(file, line, how, origin,
                                                 inside if inside != (file, line) else None)
        decision.count += 1

    def as_list(self) -> list[dict]:
        return [d.as_dict() for d in self.seen.values()]


# --- marked values -----------------------------------------------------------------------------

_decisions: Decisions | None = None          # the fake run's (one per process)
_arm_sizes = None                             # watches the size arguments, once an int is marked


def _decide(value, how: str) -> None:
    if _decisions is not None:
        _decisions.record(value._origin, how)


def _first_origin(*values):
    for value in values:
        origin = getattr(value, "_origin", None)
        if origin is not None:
            return origin
    return None


def mark(value, origin: Origin):
    """`value` (a number, a list of them, a numpy array or scalar) marked as assumed."""
    import numpy
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if _arm_sizes is not None:
            _arm_sizes()
        marked = AssumedInt(value)
    elif isinstance(value, float):
        marked = AssumedFloat(value)
    elif isinstance(value, list):
        return [mark(v, origin) for v in value]
    elif isinstance(value, tuple):
        return tuple(mark(v, origin) for v in value)
    elif isinstance(value, numpy.ndarray):
        marked = value.view(AssumedArray)
    elif isinstance(value, numpy.generic):
        return mark(value.item(), origin)
    else:
        return value
    marked._origin = origin
    return marked


def _keep(result, *operands):
    """Arithmetic on a marked value gives a marked value; a truth value made from one (numpy's
    `(a > 0).any()`) decides where it is made, as a comparison of marked numbers does."""
    origin = _first_origin(*operands)
    if origin is None or result is NotImplemented:
        return result
    if isinstance(result, bool) or (type(result).__module__ == "numpy" and
                                    type(result).__name__ in ("bool", "bool_")):
        if _decisions is not None:
            _decisions.record(origin, "a truth value computed from it")
        return result
    return mark(result, origin)


def _arithmetic(base, names):
    """Methods of `base` that return marked results."""
    def make(name):
        method = getattr(base, name)

        def wrapped(self, *others):
            return _keep(method(self, *others), self, *others)
        wrapped.__name__ = name
        return wrapped
    return {name: make(name) for name in names if hasattr(base, name)}


def _deciding(base, names, how):
    """Methods of `base` whose use decides something: recorded, then answered plainly."""
    def make(name):
        method = getattr(base, name)

        def wrapped(self, *others):
            _decide(self, how)
            return method(self, *others)
        wrapped.__name__ = name
        return wrapped
    return {name: make(name) for name in names if hasattr(base, name)}


_OPS = ["__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
        "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
        "__rpow__", "__neg__", "__pos__", "__abs__", "__divmod__"]
_COMPARISONS = ["__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__bool__"]
_TO_INTEGER = ["__int__", "__index__", "__trunc__", "__floor__", "__ceil__"]


def _round(base, value, digits):
    """round(x) makes an integer (a decision); round(x, 2) a number to print (kept marked)."""
    if not digits or digits[0] is None:
        _decide(value, "a conversion to an integer")
        return base.__round__(value)
    return _keep(base.__round__(value, *digits), value)


AssumedFloat = type("AssumedFloat", (float,), {
    "__doc__": "A float a fake run assumed (an `.item()` of a large tensor).",
    "__hash__": float.__hash__, "__round__": lambda self, *digits: _round(float, self, digits),
    "__reduce__": lambda self: (float, (float.__float__(self),)),     # saved as a plain float
    **_arithmetic(float, _OPS), **_deciding(float, _COMPARISONS, "a comparison"),
    **_deciding(float, _TO_INTEGER, "a conversion to an integer")})
AssumedInt = type("AssumedInt", (int,), {
    "__doc__": "An integer a fake run assumed.",
    "__hash__": int.__hash__, "__round__": lambda self, *digits: _round(int, self, digits),
    "__reduce__": lambda self: (int, (int.__int__(self),)),
    **_arithmetic(int, [*_OPS, "__lshift__", "__rshift__", "__and__", "__or__", "__xor__",
                        "__rand__", "__ror__", "__rxor__", "__invert__"]),
    **_deciding(int, _COMPARISONS, "a comparison"),
    **_deciding(int, _TO_INTEGER, "a conversion to an integer")})


def _array_type():
    import numpy

    class AssumedArray(numpy.ndarray):
        """A host array of assumed values (`.numpy()` of a device result too large to know):
        reductions and elements come out marked, truth tests and conversions decide."""

        def __array_finalize__(self, obj):
            self._origin = getattr(obj, "_origin", None)

        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            plain = [i.view(numpy.ndarray) if isinstance(i, AssumedArray) else i for i in inputs]
            if "out" in kwargs:
                kwargs["out"] = tuple(o.view(numpy.ndarray) if isinstance(o, AssumedArray) else o
                                      for o in kwargs["out"])
            return _keep(getattr(ufunc, method)(*plain, **kwargs), *inputs)

        def __array_function__(self, func, types, args, kwargs):
            return _keep(super().__array_function__(func, (numpy.ndarray,), _unmarked(args),
                                                    _unmarked(kwargs)), self)

        def __getitem__(self, index):
            return _keep(numpy.ndarray.__getitem__(self.view(numpy.ndarray), index), self)

        locals().update(_plain_then_marked(numpy.ndarray, (
            "item", "tolist", "mean", "sum", "prod", "max", "min", "std", "var", "argmax",
            "argmin", "any", "all", "cumsum", "round", "astype", "copy", "reshape")))

        def __reduce__(self):                   # pickled as the plain array it stands for
            return numpy.ndarray.__reduce__(self.view(numpy.ndarray))

        locals().update(_deciding(numpy.ndarray, ["__bool__", "__int__", "__index__"],
                                  "a truth test or conversion of an array"))

    return AssumedArray


def _plain_then_marked(base, names):
    """Array methods run on the plain array, their result marked (numpy's own methods may
    hand back a plain scalar past __array_ufunc__)."""
    def make(name):
        method = getattr(base, name)

        def wrapped(self, *args, **kwargs):
            return _keep(method(self.view(base), *args, **kwargs), self)
        wrapped.__name__ = name
        return wrapped
    return {name: make(name) for name in names}


def _unmarked(value):
    import numpy
    if isinstance(value, numpy.ndarray) and type(value) is not numpy.ndarray and \
            getattr(value, "_origin", None) is not None:
        return value.view(numpy.ndarray)
    if isinstance(value, (list, tuple)):
        return type(value)(_unmarked(v) for v in value)
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items()}
    return value


try:
    AssumedArray = _array_type()
except ImportError:                             # no numpy: no arrays to mark
    AssumedArray = type("AssumedArray", (), {})


# --- the fake run's side -----------------------------------------------------------------------

# torch functions and Tensor methods that take sizes: a marked integer there decides memory
SIZED_FUNCTIONS = ("empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange",
                   "empty_strided", "randperm", "eye", "linspace", "tensor_split", "split")
SIZED_METHODS = ("view", "reshape", "expand", "repeat", "new_empty", "new_zeros", "new_ones",
                 "new_full", "narrow", "resize_", "split", "chunk", "unflatten", "tile")


def install(torch, answers, decisions: Decisions) -> None:
    """Hand out marked values from the fake run's reads, and watch the size arguments."""
    global _decisions
    _decisions = decisions
    from ..profile.stacks import pass_through
    pass_through(__file__)              # what the watched functions allocate keeps the user's line
    answers.decisions = decisions
    tensor = torch.Tensor
    item = tensor.item

    def item_(self):
        before = answers.assumed
        value = item(self)
        if answers.assumed == before:            # a real value (a shadow) or a given one
            return value
        origin = answers.last_origin
        if isinstance(value, bool):              # a boolean read is decided where it is read
            decisions.record(origin, "a boolean read with .item()")
            return value
        return mark(value, origin)

    def deciding(method, how):
        def read(self):
            before = answers.assumed
            value = method(self)
            if answers.assumed != before:
                decisions.record(answers.last_origin, how)
            return value
        return read

    tensor.item = item_
    tensor.__bool__ = deciding(tensor.__bool__, "the truth of a tensor (bool(), if, while)")
    tensor.__int__ = deciding(tensor.__int__, "int() of a tensor")
    tensor.__index__ = deciding(tensor.__index__, "a tensor used as an index or a count")
    # `with torch.device(...)` tells a factory by identity, from a set made on first use: made
    # now, it holds PyTorch's own functions, which the watched ones call
    from torch.utils._device import _device_constructors
    _device_constructors()

    def arm_sizes() -> None:
        """The size arguments are watched from the first marked integer on: until then they
        cannot hold one, and a wrapper on every view and reshape would cost each run."""
        global _arm_sizes
        _arm_sizes = None
        for name in SIZED_FUNCTIONS:
            if hasattr(torch, name):
                setattr(torch, name, _watch_sizes(getattr(torch, name), decisions, name))
        for name in SIZED_METHODS:
            if hasattr(tensor, name):
                setattr(tensor, name, _watch_sizes(getattr(tensor, name), decisions, name))

    global _arm_sizes
    _arm_sizes = arm_sizes
    import math
    _watch_tests(math, ("isnan", "isinf", "isfinite"), decisions)
    try:
        import numpy
    except ImportError:
        return
    _watch_tests(numpy, ("isnan", "isinf", "isfinite"), decisions)


def _watch_tests(module, names, decisions: Decisions) -> None:
    """math.isnan(loss) and numpy's isnan/isinf/isfinite of a marked number decide on it."""
    for name in names:
        function = getattr(module, name, None)
        if function is None:
            continue

        def watched(value, *args, _function=function, **kwargs):
            origin = getattr(value, "_origin", None)
            if origin is not None:
                decisions.record(origin, "a test of the value (isnan, isinf, isfinite)")
            return _function(value, *args, **kwargs)
        watched.__name__, watched.__doc__ = name, function.__doc__
        setattr(module, name, watched)


class _RangeType(type):
    def __instancecheck__(cls, value) -> bool:
        return isinstance(value, range)


class WatchedRange(metaclass=_RangeType):
    """`range` in the script's own globals: a loop bound built on a marked integer decides."""

    def __new__(cls, *args):
        origin = _first_origin(*args)
        if origin is not None and _decisions is not None:
            _decisions.record(origin, "a loop bound (range)")
        return range(*args)


def script_globals() -> dict:
    """Names the script's module starts with (runpy's init_globals)."""
    return {"range": WatchedRange}


def _watch_sizes(function, decisions: Decisions, name: str):
    how = f"a size given to {name}()"

    def watched(*args, **kwargs):
        for value in (*args, *kwargs.values()):
            origin = getattr(value, "_origin", None)
            if origin is None and isinstance(value, (list, tuple)):
                origin = _first_origin(*value)
            if origin is not None and not isinstance(value, AssumedFloat):
                decisions.record(origin, how)
                break
        return function(*args, **kwargs)
    watched.__name__, watched.__doc__ = getattr(function, "__name__", name), function.__doc__
    return watched
