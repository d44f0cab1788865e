"""Reading backend settings from environment variables, with errors that name the variable."""

from __future__ import annotations

import os
from typing import Callable, Mapping

from ..errors import InvalidParamError


def setting(name: str, parse: Callable, default, environ: Mapping[str, str] | None = None):
    """`parse` of variable `name`, or `default` when it is unset or blank."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return default
    try:
        return parse(text)
    except ValueError as exc:
        raise InvalidParamError(f"environment variable {name}={text!r}: {exc}") from None
