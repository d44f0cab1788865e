"""Reading pickles from others without running their code, or running out of memory.

A PyTorch memory snapshot is dicts, lists, tuples, strings and numbers; a pickle that asks for
any class or function (the way hostile pickles run code) is refused. A few bytes of pickle can
also ask for gigabytes: a memo index of 2**31 makes the unpickler allocate and clear a 16 GiB
table. So the whole file is read first (bounded), and the unpickler runs under a memory cap:
the process's address-space limit, lowered while it runs, when no other thread could be hurt
by it; otherwise a scan of the opcodes checks every memo index beforehand (slower: ~0.1 s/MiB).
Every refusal is an UnsafePickleError with one sentence.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import threading
from contextlib import contextmanager

try:
    import resource
except ImportError:                # not on Windows: the opcode scan guards the memo there
    resource = None

GiB = 1 << 30
# The unpickled objects may take this many times the pickle's bytes (snapshots take ~5x).
EXPANSION = 32


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle is not plain data, is damaged, or asks for more memory than it could need."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise UnsafePickleError(f"it asks for {module}.{name}; a memory snapshot holds only plain "
                                "data, so npumem does not load it (it could run code)")


def loads(data: bytes) -> object:
    """The plain data a pickle holds; UnsafePickleError for anything else."""
    allowance = max(2 * GiB, EXPANSION * len(data))
    with _memory_cap(allowance) as capped:
        if not capped:
            _check_memo_indices(data)
        try:
            return _PlainDataUnpickler(io.BytesIO(data)).load()
        except UnsafePickleError:
            raise
        except MemoryError:
            raise UnsafePickleError(f"unpickling it needs more than {allowance // GiB} GiB of "
                                    f"memory, though it is {len(data)} bytes long") from None
        except (pickle.UnpicklingError, EOFError, ValueError, OverflowError, IndexError,
                KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise UnsafePickleError(f"a truncated or damaged pickle ({type(exc).__name__}: {exc})") from None


def _check_memo_indices(data: bytes) -> None:
    """Refuse memo indices a pickler could not have written (it numbers entries 0, 1, 2...),
    before the unpickler sizes its memo table by them."""
    count = 0
    try:
        for count, (opcode, argument, position) in enumerate(pickletools.genops(data)):
            if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and argument > count + 1024:
                raise UnsafePickleError(f"memo index {argument} at byte {position}, after only "
                                        f"{count} opcodes: not a pickle a pickler wrote")
    except UnsafePickleError:
        raise
    except Exception as exc:  # noqa: BLE001 - genops raises many kinds on damaged input
        raise UnsafePickleError(f"a truncated or damaged pickle (opcode {count}: {exc})") from None


@contextmanager
def _memory_cap(allowance: int):
    """Lower the address-space limit to what the process maps now plus `allowance`, and yield
    True; yield False (and change nothing) where that could fail another thread's allocation."""
    if resource is None or threading.active_count() > 1 or not os.path.exists("/proc/self/statm"):
        yield False
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = mapped + allowance
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield True                                     # already as tight as ours
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield True
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
