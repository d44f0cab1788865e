"""Reading pickles from others without running their code: only plain data may come back.

A PyTorch memory snapshot is dicts, lists, tuples, strings and numbers; a pickle that asks for
any class or function (the way hostile pickles run code) is refused with a clear error.
"""

from __future__ import annotations

import pickle


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle names a class or function: it is not plain data."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise UnsafePickleError(f"it asks for {module}.{name}; a memory snapshot holds only plain "
                                "data, so npumem does not load it (it could run code)")


def load(handle) -> object:
    """pickle.load, refusing every global."""
    return _PlainDataUnpickler(handle).load()
