"""The settings the what-if picker offers: those `npumem tune` tries (whatif.torch_tune), each
with a line saying what it changes; any other PYTORCH_CUDA_ALLOC_CONF text may be typed."""

from __future__ import annotations

_HELP = {
    "": "the settings the run used (as recorded)",
    "expandable_segments": "grow segments in place by mapping pages, instead of new cudaMalloc "
                           "segments (less fragmentation)",
    "max_split_size_mb": "never split cached blocks larger than this (MiB): big blocks stay "
                         "whole for big requests",
    "roundup_power2_divisions": "round request sizes up to one of N steps per power of two "
                                "(more reuse, some waste)",
    "garbage_collection_threshold": "free idle cached blocks once this fraction of the allowed "
                                    "memory is reserved (under a memory fraction)",
}


def settings(source) -> list[dict]:
    """[{name, value, help}]: `value` is the text to POST to /api/whatif."""
    from ..whatif.torch_tune import CANDIDATES, GC_CANDIDATES

    out = []
    for text in (*CANDIDATES, *GC_CANDIDATES):
        keys = [part.split(":", 1)[0] for part in text.split(",") if part]
        help_text = "; ".join(_HELP.get(key, key) for key in keys) if keys else _HELP[""]
        out.append({"name": text or "(as recorded)", "value": text, "help": help_text})
    return out
