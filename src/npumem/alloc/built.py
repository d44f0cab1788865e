"""The caching pool's C parts (free list, counts, the statistics adaptor), or a clear refusal.

They have no Python statement to fall back on (one statement of each rule; the Python oracles
live in the tests), so a checkout used before `pip install -e .` has built them stops here with
what to do, not with a bare "cannot import name".
"""

from __future__ import annotations

import importlib


def native(name: str):
    """The extension module `npumem.alloc.<name>`, built by `pip install -e .`."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as error:
        raise ImportError(
            f"npumem's caching pool needs its C extension {name} (the pool's free list and "
            "counts are C): install npumem with `pip install -e .` in its checkout (it needs a "
            f"C compiler and Python's headers); {error}") from error
