"""Integer handles for runtime objects, as pyACL hands them out (streams, events, contexts).

Handles are nonzero and unique for the life of the process; 0 keeps its pyACL meaning of
"the default". A pyACL program holds only the integer, so the registry keeps each object alive
until it is destroyed (`forget`).
"""

from __future__ import annotations

import itertools
import threading

from ..errors import InvalidHandleError

_counter = itertools.count(1)
_objects: dict[int, object] = {}
_lock = threading.Lock()


def new_handle(obj: object) -> int:
    with _lock:
        handle = 0x5A0000000000 + next(_counter) * 0x40
        _objects[handle] = obj
    return handle


def forget(handle: int) -> None:
    """Drop the registry's reference to a destroyed object."""
    with _lock:
        _objects.pop(handle, None)


def lookup(handle_or_object, kind: type, what: str):
    """The live `kind` object for a handle (or the object itself)."""
    if isinstance(handle_or_object, kind):
        obj = handle_or_object
    else:
        if not isinstance(handle_or_object, int):
            raise InvalidHandleError(f"{what}: expected a {kind.__name__} or its handle, got "
                                     f"{type(handle_or_object).__name__}")
        obj = _objects.get(handle_or_object)
        if not isinstance(obj, kind):
            raise InvalidHandleError(f"{what}: 0x{handle_or_object:x} is not the handle of a live "
                                     f"{kind.__name__} (destroyed, or never created)")
    obj.check_alive()
    return obj
