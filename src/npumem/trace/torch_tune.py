"""`npumem tune` for PyTorch recordings: which PYTORCH_CUDA_ALLOC_CONF (or
PYTORCH_NPU_ALLOC_CONF) would have reserved the least, or would have finished on a smaller
device.

Every candidate is PyTorch's own setting replayed through the faithful model of its allocator,
from the recording's start state (memory allocated before the trace stays where it was: it was
placed under the settings the run used). The winner finishes (no out-of-memory) with the lowest
peak reserved; fewer segment allocations, then the shorter line, break ties.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..alloc.torch_model import TorchAllocatorConfig, from_snapshot, parse_config
from ..units import format_size
from .recording import Recording
from .torch_replay import TorchReplay, replay_recording

# PyTorch's knobs that change placement (garbage_collection_threshold acts only under
# set_per_process_memory_fraction, so it is tried only where that is in force).
CANDIDATES = (
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_size_mb:128,roundup_power2_divisions:4",
)
GC_CANDIDATES = ("garbage_collection_threshold:0.6", "garbage_collection_threshold:0.8")


@dataclass
class Candidate:
    config: TorchAllocatorConfig
    result: TorchReplay

    @property
    def line(self) -> str:
        text = self.config.describe()
        return f"{self.config.env_name}={text}" if text else f"{self.config.env_name} unset"

    @property
    def finishes(self) -> bool:
        return self.result.oom is None


@dataclass
class TorchTuning:
    trace: str
    flavour: str
    memory: int | None
    recorded: Candidate                   # the settings the recording ran with
    best: Candidate | None                # None: nothing finishes on that memory
    candidates: list[Candidate]
    recorded_peak_reserved_bytes: int | None    # None: no allocator segments were recorded
    pool_peak_reserved_bytes: int | None = None
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        def row(c: Candidate) -> dict:
            return {"settings": c.config.describe(), "env": c.line, "finishes": c.finishes,
                    "peak_reserved_bytes": c.result.peak_reserved_bytes,
                    "device_allocs": c.result.device_allocs, "oom": c.result.oom}
        return {"trace": self.trace, "flavour": self.flavour, "memory_bytes": self.memory,
                "recommended": row(self.best) if self.best else None,
                "recommended_env": self.best.line if self.best else None,
                "predicted_peak_reserved_bytes": self.best.result.peak_reserved_bytes if self.best else None,
                "recorded_peak_reserved_bytes": self.recorded_peak_reserved_bytes,
                "as_recorded": row(self.recorded),
                "npumem_pool_peak_reserved_bytes": self.pool_peak_reserved_bytes,
                "reasons": self.reasons, "candidates": [row(c) for c in self.candidates]}


def tune_recording(recording: Recording, memory: int | None = None,
                   candidates=CANDIDATES, progress=None) -> TorchTuning:
    """Replay each candidate on `recording`; `memory` replays on a device of that size."""
    base = from_snapshot(recording.settings, recording.flavour)
    texts = list(candidates)
    if base.per_process_memory_fraction is not None and memory:
        texts += GC_CANDIDATES
    results = []
    for done, text in enumerate(texts):
        config = parse_config(text, base=base) if text else base
        results.append(Candidate(config, replay_recording(recording, config, capacity=memory)))
        if progress is not None:
            progress(done + 1, len(texts))
    recorded = results[0]
    recorded_peak = recorded.result.recorded_peak_reserved_bytes
    finishing = [c for c in results if c.finishes]
    ranked = sorted(finishing, key=lambda c: (c.result.peak_reserved_bytes,
                                              c.result.device_allocs, len(c.config.describe())))
    best = ranked[0] if ranked else None
    tuning = TorchTuning(recording.path, recording.flavour, memory, recorded, best, results,
                         recorded_peak)
    tuning.reasons = _reasons(tuning)
    return tuning


def _reasons(tuning: TorchTuning) -> list[str]:
    best, recorded = tuning.best, tuning.recorded
    out = []
    if tuning.memory is not None:
        fits = [c for c in tuning.candidates if c.finishes]
        out.append(f"on a device with {format_size(tuning.memory)} for PyTorch, "
                   f"{len(fits)} of {len(tuning.candidates)} settings finish the recording")
        if not recorded.finishes:
            oom = recorded.result.oom
            out.append(f"as recorded it runs out of memory at trace entry {oom['index']} "
                       f"(asks {format_size(oom['alloc_bytes'])} with "
                       f"{format_size(oom['reserved_bytes'] - oom['allocated_bytes'])} reserved "
                       f"but unallocated, largest cached block "
                       f"{format_size(oom['largest_free_bytes'])})")
    if best is None:
        live = max(c.result.peak_allocated_bytes for c in tuning.candidates)
        out.append(f"none of the candidates finishes; the live tensors reach "
                   f"{format_size(live)} before the first OOM, with "
                   f"{format_size(tuning.recorded.result.start_allocated_bytes)} of them live "
                   f"before the trace began")
        return out
    saved = recorded.result.peak_reserved_bytes - best.result.peak_reserved_bytes
    live = best.result.peak_allocated_bytes
    if best is recorded:
        out.append("the settings the run used already reserve the least among the candidates")
    elif saved > 0:
        out.append(f"{best.config.describe()} reserves {format_size(saved)} less at peak than "
                   f"the recorded settings ({format_size(best.result.peak_reserved_bytes)} vs "
                   f"{format_size(recorded.result.peak_reserved_bytes)})")
        if best.config.expandable_segments and not recorded.config.expandable_segments:
            out.append("expandable segments grow one address range per stream instead of "
                       "caching whole segments, so freed space is not stranded in segments "
                       "that are partly in use")
        elif best.config.max_split_size != recorded.config.max_split_size:
            out.append("blocks above max_split_size are not split for smaller requests, so big "
                       "cached blocks stay whole for the big requests that need them")
        elif best.config.roundup_power2_divisions != recorded.config.roundup_power2_divisions:
            out.append("rounding requests to power-of-2 divisions makes sizes repeat, so freed "
                       "blocks fit later requests")
    if live:
        out.append(f"peak live tensors: {format_size(live)}; the recommendation reserves "
                   f"{best.result.peak_reserved_bytes / live:.3f}x that")
    return out
