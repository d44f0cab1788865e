"""FakeTensorMode's answers, remembered cheaply: the fake run's operators at tens of microseconds.

FakeTensorMode spends 100-350 us of Python on every operator of this VM, even when its own
cache answers (most of it hashing the arguments), and milliseconds where it runs a Python meta
kernel or decomposition. A training loop repeats the same operators on the same shapes, so this
cache asks FakeTensorMode once per (operator, inputs' metadata) and then makes the results itself:

- an operator that writes into an input (`add_`, `copy_`, out=) gives that input back;
- a new result is a new fake tensor of the remembered shape, strides and dtype, on the
  remembered device, made as FakeTensorMode makes one (a meta tensor wrapped as a FakeTensor);
- a view runs PyTorch's meta kernel on the input's storage directly (every view operator has a
  C++ one), as FakeTensorMode runs it;
- an operator's new shapes run its meta kernel directly too, once that kernel made what
  FakeTensorMode made on the operator's first new shape (never for an operator that writes into
  its inputs, nor for FakeTensorMode's own implementations: convolutions, attention, factories).

Anything else goes to FakeTensorMode, every time: real tensors among the inputs (but a host
scalar), sizes that depend on data, results that are not tensors, an operator that changed an
input's shape (resize_, set_). The key is made of what decides a result's metadata at the
dispatcher: the operator, each argument's value or, for a tensor, its shape, strides, offset,
dtype and device, and the default dtype (factories).
"""

from __future__ import annotations

NOT_CACHED = object()               # the cache's value for a key FakeTensorMode must answer
_UNSET = object()


class FakeCache:
    def __init__(self, torch, fake_mode):
        from torch._subclasses.fake_tensor import FakeTensor
        self.torch, self.mode, self.fake_type = torch, fake_mode, FakeTensor
        self.entries: dict = {}
        self.hits = self.misses = self.views = 0
        self._never: set = set()    # operators that change their inputs' metadata
        self._blind: dict = {}      # operator -> results blind to float values (_part)
        self._script_object = torch.ScriptObject
        self._direct: set = set()   # operators that return a view without being one (_unsafe_view)
        self._trusted: dict = {}    # operator -> its meta kernel agreed with FakeTensorMode
        self._template: dict | None = None   # a FakeTensor's own attributes, as __new__ sets them
        self._mark = (torch._C._set_warn_deprecated_on_mutable_data_ptr
                      if fake_mode._allow_unsafe_data_ptr_access
                      else torch._C._set_throw_on_mutable_data_ptr)
        self._make = torch.Tensor._make_subclass
        self._strided = torch.strided
        C = torch._C
        self._disable, self._preserve, self._meta_tls = (
            C._DisableTorchDispatch, C._PreserveDispatchKeyGuard, C._set_meta_in_tls_dispatch_include)
        self._tags = (torch.Tag.inplace_view, torch.Tag.dynamic_output_shape,
                      torch.Tag.data_dependent_output)

    def __call__(self, func, args, kwargs):
        """The operator's result on fake tensors: from the cache, by a view kernel, or from
        FakeTensorMode (by calling `func`, which the mode below ours receives)."""
        if func in self._never:
            return func(*args, **kwargs)
        key = self._key(func, args, kwargs)
        if key is None:
            return func(*args, **kwargs)
        if func.is_view or func in self._direct:
            if type(args[0]) is not self.fake_type:     # lift_fresh of a real tensor
                return func(*args, **kwargs)
            return self._view(func, args, kwargs)
        try:
            entry = self.entries.get(key)
        except TypeError:           # an argument with no hash: FakeTensorMode answers
            return func(*args, **kwargs)
        if entry is None:
            self.misses += 1
            return self._learn(key, func, args, kwargs)
        if entry is NOT_CACHED:
            return func(*args, **kwargs)
        self.hits += 1
        kind, value = entry
        if kind == "many":
            return type(value)(self._output(item, args, kwargs) for item in value)
        return self._output(value, args, kwargs)

    # --- the key ---------------------------------------------------------------------------------

    def _key(self, func, args, kwargs):
        """A hashable summary of the call, or None where a fast path cannot answer it."""
        fake_type, strided = self.fake_type, self._strided
        blind = self._blind.get(func)
        if blind is None:
            blind = self._blind[func] = (func.name().startswith("aten::_foreach_")
                                         or self.torch.Tag.pointwise in func.tags)
        parts = [func, self.torch.get_default_dtype()]
        try:
            for value in args:
                if type(value) is fake_type and value.layout is strided:
                    parts.append((value.shape, value.stride(), value.storage_offset(), value.dtype,
                                  value._fake_device))       # the common case, inline
                else:
                    parts.append(self._part(value, blind))
            for name, value in kwargs.items():
                parts.append(name)
                parts.append(self._part(value, blind))
        except LookupError:
            return None
        return tuple(parts)

    def _part(self, value, blind: bool):
        """`blind`: the operator's result does not depend on a float's value (pointwise and
        foreach operators: an optimizer's bias corrections change every step)."""
        kind = type(value)
        if kind is self.fake_type:
            if value.layout is not self._strided:
                raise LookupError
            return (value.shape, value.stride(), value.storage_offset(), value.dtype,
                    value._fake_device)
        if kind is list or kind is tuple:
            return (kind, *(self._part(v, blind) for v in value))
        if isinstance(value, self.torch.Tensor):
            # a real host scalar (an optimizer's step count): FakeTensorMode converts it, and
            # only its metadata counts; other real tensors are converted every time
            if value.dim() or value.device.type != "cpu" or value.layout is not self._strided:
                raise LookupError
            return ("real", value.dtype)
        if (kind is float and blind) or kind is self._script_object:
            return kind             # a profiler's record_function handle: its type says all
        return (kind, value)        # 1, 1.0 and True are equal, but make different dtypes

    # --- what FakeTensorMode answers, remembered -----------------------------------------------

    def _learn(self, key, func, args, kwargs):
        before = self._aliasable(args, kwargs)
        device = self._one_device(args, kwargs)
        trusted = self._trusted.get(func) if device is not None else False
        out = _UNSET
        if trusted:
            try:
                out = self._kernel(func, args, kwargs, device)
            except Exception:       # FakeTensorMode says what is wrong, as it would have
                out = _UNSET
        if out is _UNSET:
            out = func(*args, **kwargs)
            if trusted is None:
                self._trusted[func] = self._agrees(func, args, kwargs, device, out)
        entry = NOT_CACHED
        if not any(tag in func.tags for tag in self._tags):
            try:
                entry = self._entry(out, args, kwargs, before)
            except _Direct:
                entry = "direct" if isinstance(out, self.fake_type) else NOT_CACHED
            except LookupError:
                entry = NOT_CACHED
            if entry is None:       # it changed an input's metadata: never for this operator
                self._never.add(func)
                entry = NOT_CACHED
            elif entry == "direct":  # it viewed its first input: a view from now on
                self._direct.add(func)
                entry = NOT_CACHED
        self.entries[key] = entry
        return out

    # --- new shapes: the meta kernel, once it agreed with FakeTensorMode --------------------------

    def _one_device(self, args, kwargs):
        """The device of every tensor argument (all fake), or None: a factory, a `device`
        argument, a real tensor or two devices are FakeTensorMode's to place."""
        if "device" in kwargs:
            return None
        device = None
        for value in (*args, *kwargs.values()):
            items = value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if type(item) is self.fake_type:
                    if device is None:
                        device = item._fake_device
                    elif item._fake_device != device:
                        return None
                elif isinstance(item, self.torch.Tensor):
                    return None
        return device

    def _agrees(self, func, args, kwargs, device, expected) -> bool:
        """Whether the operator's meta kernel, run directly, makes what FakeTensorMode made
        (asked at an operator's first new shape; FakeTensorMode's own implementations of an
        operator, a convolution's memory format or an attention's seeds, are never replaced)."""
        from torch._subclasses import fake_impls
        if func._schema.is_mutable:     # run twice, unsqueeze_ would add two dimensions
            return False
        if any(check(func) for check, _ in fake_impls.op_implementations_checks) or \
                self.torch._library.simple_registry.singleton.find(func.name()).fake_impl.kernel:
            return False
        inputs = [*args, *kwargs.values()]
        inputs += [t for value in inputs if isinstance(value, (list, tuple)) for t in value]
        try:
            got = self._kernel(func, args, kwargs, device)
        except Exception:           # no meta kernel, a size that depends on data: never
            return False
        return _signature(got, inputs) == _signature(expected, inputs)

    def _aliasable(self, args, kwargs) -> dict:
        """Each fake input's metadata by id, to tell an operator that reshapes its input."""
        return {id(t): self._meta(t) for t in _tensors((*args, *kwargs.values()), self.fake_type)}

    @staticmethod
    def _meta(t) -> tuple:
        return (t.shape, t.stride(), t.storage_offset(), t.untyped_storage().nbytes())

    def _entry(self, out, args, kwargs, before):
        if isinstance(out, (list, tuple)):
            return ("many", type(out)(self._one(item, args, kwargs, before) for item in out))
        return ("one", self._one(out, args, kwargs, before))

    def _one(self, out, args, kwargs, before):
        """('arg', place) for an input given back (its index, or its name for out=), ('new',
        metadata) for a new tensor, ('none', None) for no tensor; None for an operator that
        changed its input's shape; LookupError for what the cache cannot make again."""
        if out is None:
            return ("none", None)
        if type(out) is not self.fake_type or out.layout is not self._strided:
            raise LookupError
        for place, arg in (*enumerate(args), *kwargs.items()):     # (out=: by name)
            if arg is out:
                if before.get(id(arg)) != self._meta(out):
                    return None                     # resize_, set_: the input changed shape
                return ("arg", place)
        storage = out.untyped_storage()
        first = args[0] if args else None
        if type(first) is self.fake_type and first.untyped_storage()._cdata == storage._cdata:
            raise _Direct
        inputs = {t.untyped_storage()._cdata
                  for t in _tensors((*args, *kwargs.values()), self.fake_type)}
        if storage._cdata in inputs or out.storage_offset() != 0 or out.is_conj() or out.is_neg():
            raise LookupError
        with self._disable():
            fresh = self.torch.empty_strided(out.shape, out.stride(), dtype=out.dtype,
                                             device="meta")
        if fresh.untyped_storage().nbytes() != storage.nbytes():
            raise LookupError                      # a storage larger than its tensor
        return ("new", (tuple(out.shape), out.stride(), out.dtype, out.fake_device))

    def _output(self, item, args, kwargs):
        kind, value = item
        if kind == "arg":
            return kwargs[value] if isinstance(value, str) else args[value]
        if kind == "none":
            return None
        shape, stride, dtype, device = value
        with self._disable():
            elem = self.torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        return self._wrap(elem, device)

    def _wrap(self, elem, device):
        """A FakeTensor around a meta tensor, with the attributes FakeTensor.__new__ gives it."""
        if self._template is None:
            with self._disable():
                model = self.fake_type(self.mode, self.torch.empty(0, device="meta"), device)
            self._template = dict(model.__dict__)
        tensor = self._make(self.fake_type, elem, False, dispatch_device=True,
                            device_for_backend_keys=device)
        self._mark(tensor)
        tensor.__dict__.update(self._template)
        tensor._fake_device = device
        return tensor

    # --- views -----------------------------------------------------------------------------------

    def _view(self, func, args, kwargs):
        """A view by PyTorch's meta kernel, on the input's own (meta) storage."""
        self.views += 1
        return self._kernel(func, args, kwargs, args[0]._fake_device)   # the tensor it views

    def _kernel(self, func, args, kwargs, device):
        """The operator's meta kernel on the fake inputs, as FakeTensorMode runs one: new
        results wrapped as fake tensors on `device`, inputs given back as they are."""
        mode = self.mode
        before = mode.in_kernel_invocation
        with self._disable(), self._preserve():
            self._meta_tls(True)            # the meta key, and fake tensors say "meta"
            mode.in_kernel_invocation = True
            try:
                out = func(*args, **kwargs)
            finally:
                mode.in_kernel_invocation = before
        if isinstance(out, (list, tuple)):
            return type(out)(self._wrapped(item, device) for item in out)
        return self._wrapped(out, device)

    def _wrapped(self, value, device):
        if type(value) is self.fake_type or not isinstance(value, self.torch.Tensor):
            return value
        return self._wrap(value, device)


class _Direct(Exception):
    """A result on its first input's storage, from an operator that is not a view."""


def _signature(value, inputs):
    """What a result is: which input, or its metadata and which inputs' storage it shares."""
    if isinstance(value, (list, tuple)):
        return (type(value), *(_signature(v, inputs) for v in value))
    if not hasattr(value, "untyped_storage"):
        return value
    for index, tensor in enumerate(inputs):
        if value is tensor:
            return ("input", index)
    storage = value.untyped_storage()
    shared = tuple(i for i, t in enumerate(inputs) if hasattr(t, "untyped_storage")
                   and t.untyped_storage()._cdata == storage._cdata)
    return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype,
            value.fake_device, storage.nbytes(), shared)


def _tensors(values, fake_type):
    for value in values:
        if type(value) is fake_type:
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value, fake_type)
