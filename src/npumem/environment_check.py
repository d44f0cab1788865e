"""npumem's NPUMEM_* switches, checked in one place: a value npumem would not read as meant is
an error naming the values it takes, never silently read as "off" or as the default.

Checked when the runtime starts (`npumem.init()`) and before any `npumem` command runs; each
module still reads its own variable where it uses it.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

from .errors import InvalidParamError

SWITCH = ("0", "1")
YES_NO = ("0", "1", "true", "false", "yes", "no", "on", "off")


def _choice(values: tuple[str, ...]) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        return None if text.lower() in values else f"takes {', '.join(values)}"
    return check


def _number(low: float, high: float, whole: bool = False) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            kind = "a whole number" if whole else "a number"
            return f"takes {kind} from {low:g} to {high:g}"
        return None
    return check


def _profile(text: str) -> str | None:
    from .aicore.profile import PROFILES

    return None if text.lower() in PROFILES else f"takes {', '.join(sorted(PROFILES))}"


def _sanitize(text: str) -> str | None:
    from .device.sanitizer import LEVELS

    if text.lower() in LEVELS:
        return None
    return (f"takes {', '.join(LEVELS)} (free: use after free and double free in the pools, "
            "at no cost per allocation; 1 or full: every access, about 3x the pool's cost)")


def _size(text: str) -> str | None:
    from .units import parse_size

    try:
        parse_size(text)
    except ValueError as exc:
        return str(exc)
    return None


CHECKS: dict[str, Callable[[str], str | None]] = {
    "NPUMEM_SIM_PROFILE": _profile,
    "NPUMEM_SIM_CORES": _number(1, 1024, whole=True),
    "NPUMEM_SIM_KERNELS": _choice(("numpy", "tiled")),
    "NPUMEM_STRICT": _choice(SWITCH),
    "NPUMEM_SANITIZE": _sanitize,
    "NPUMEM_ACL_RET_FIRST": _choice(YES_NO[:6]),         # acl/_result.py: 1, true, yes
    "NPUMEM_PROFILE": _choice(YES_NO),
    "NPUMEM_PROFILE_STACKS": _choice(YES_NO),
    "NPUMEM_PROFILE_INTERVAL_MS": _number(0.01, 3_600_000),
    "NPUMEM_MAX_SNAPSHOT_BYTES": _size,
    "NPUMEM_FAKE_DEVICES": _number(1, 64, whole=True),     # set by npumem estimate
}


def problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per NPUMEM_* switch set to a value npumem would not read as meant."""
    environ = os.environ if environ is None else environ
    found = []
    for name, check in CHECKS.items():
        text = environ.get(name, "").strip()
        if text:
            reason = check(text)
            if reason:
                found.append(f"{name}={text!r}: {reason}")
    return found


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise InvalidParamError naming each bad NPUMEM_* switch and what it takes."""
    found = problems(environ)
    if found:
        raise InvalidParamError("; ".join(found))
