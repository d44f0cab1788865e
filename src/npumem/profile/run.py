"""Running the user's program under a profile: a script or `-m module` as __main__, as
`python` would, with Ctrl-C held back while npumem's own recording code runs."""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import os
import runpy
import signal
import sys
import threading
import traceback
import types
from typing import NamedTuple

from ..errors import InvalidParamError


class RunOutcome(NamedTuple):
    code: int               # the script's exit code (130 when interrupted)
    globals: dict           # its module globals, kept while the leak report is taken
    interrupted: bool       # Ctrl-C ended it


def run_target(target: list[str]) -> RunOutcome:
    """Run `script.py args...` (or `-m module args...`, found as `python -m` finds it) as
    __main__. The caller keeps the globals while it takes the leak report: what the script's
    code still holds when it finishes is what leaked, not what survives interpreter teardown.
    An exception the script raises is printed and gives exit code 1; a script or module that
    is not there is an InvalidParamError."""
    if not target:
        raise InvalidParamError("nothing to profile: give a script, e.g. npumem profile -- train.py")
    if target[0] == "-m" and len(target) < 2:
        raise InvalidParamError("-m needs a module name")
    if target[0] != "-m" and not os.path.isfile(target[0]):
        raise InvalidParamError(f"no such script: {target[0]}")
    saved_argv, saved_path, saved_main = sys.argv[:], sys.path[:], sys.modules["__main__"]
    main = types.ModuleType("__main__")
    try:
        with _interrupts_outside_npumem():
            if target[0] == "-m":
                sys.path.insert(0, os.getcwd())          # as `python -m` does
                missing = _check_module(target[1])
                if missing is not None:
                    raise _NotThere(missing)
                sys.argv = [target[1], *target[2:]]
                main.__dict__.update(runpy.run_module(target[1], run_name="__main__",
                                                      alter_sys=True))
            else:
                path = os.path.abspath(target[0])
                sys.argv = list(target)
                sys.path.insert(0, os.path.dirname(path))
                main.__file__, main.__builtins__ = path, builtins
                sys.modules["__main__"] = main          # pickle and multiprocessing look here
                with open(path, "rb") as source:
                    code = compile(source.read(), path, "exec")
                exec(code, main.__dict__)
        return RunOutcome(0, main.__dict__, False)
    except _NotThere as exc:
        raise InvalidParamError(str(exc)) from None
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return RunOutcome(exc.code or 0, main.__dict__, False)
        print(exc.code, file=sys.stderr)
        return RunOutcome(1, main.__dict__, False)
    except KeyboardInterrupt:
        return RunOutcome(130, main.__dict__, True)
    except BaseException as exc:          # noqa: BLE001 - the script's own error: show it, go on
        _print_script_error(exc)
        return RunOutcome(1, main.__dict__, False)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules["__main__"] = saved_main


def _print_script_error(exc: BaseException) -> None:
    """The script's traceback as `python script.py` prints it: from the script's first frame,
    without npumem's own frames (run_target's exec) or runpy's (-m) above it."""
    import runpy

    own = {os.path.abspath(__file__), __file__, getattr(runpy, "__file__", None), "<frozen runpy>"}
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in own:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)


class _NotThere(Exception):
    """-m of a module that is not there (not the script's own error)."""


def _check_module(name: str) -> str | None:
    """Why `-m name` cannot run (None: it can): the module, or a package's __main__, is not
    there, as `python -m` checks before it runs anything. A package of the name that fails to
    import is the script's own error and propagates."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as exc:          # a parent package is missing
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return (f"no module named {exc.name!r} (from -m {name}); run from the folder that "
                    "holds it or set PYTHONPATH")
        raise
    except ValueError:                           # e.g. a relative or empty name
        spec = None
    if spec is None:
        return f"no module named {name!r} (-m {name}); run from the folder that holds it or set " \
               "PYTHONPATH"
    if spec.submodule_search_locations is not None and \
            importlib.util.find_spec(f"{name}.__main__") is None:
        return (f"-m {name}: {name!r} is a package without a __main__ module; name the module "
                f"to run, e.g. -m {name}.train")
    return None


_OWN_CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the npumem package


@contextlib.contextmanager
def _interrupts_outside_npumem(retries: int = 50, wait_s: float = 0.01):
    """Ctrl-C as Python's own handler gives it, except while npumem's recording code runs (a
    tensor recorder's weakref callback, a tracker's bookkeeping): a KeyboardInterrupt raised
    there is swallowed (callbacks ignore exceptions) or leaves the recording half-updated. It
    is raised again a moment later, once the script's own code runs (at most `retries` times
    later, so a script blocked inside npumem still stops)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield                                    # a handler of the caller's: keep it
        return
    import _thread

    deferred = [0]
    timers: list[threading.Timer] = []

    def interrupt(signum, frame):
        inside = frame is not None and frame.f_code.co_filename.startswith(_OWN_CODE)
        if inside and deferred[0] < retries:
            deferred[0] += 1
            timer = threading.Timer(wait_s, _thread.interrupt_main)
            timer.daemon = True
            timers[:] = [timer]
            timer.start()
            return
        deferred[0] = 0
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        if signal.getsignal(signal.SIGINT) is interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)
