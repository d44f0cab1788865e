"""`npumem tune`: replay a trace under candidate pool settings and recommend the best.

The seeds' "pool optimizer" made real: instead of guessing from statistics, every candidate is
replayed on the recorded workload, and the one with the lowest peak reserved memory wins (fewer
device allocations, then the shorter settings string, break ties). The reason given compares it
with the defaults and with PyTorch's policy on the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import format_size
from .replay import ReplayResult
from .sweep import ReplayJob, run_jobs, settings_label

# Candidates: the page-mapped default, and segment mode with the knobs that matter there.
CANDIDATES = (
    "",
    "roundup_power2_divisions:4",
    "expandable_segments:False",
    "expandable_segments:False,max_split_size_mb:64",
    "expandable_segments:False,max_split_size_mb:256",
    "expandable_segments:False,roundup_power2_divisions:4",
    "expandable_segments:False,segment_size_mb:4",
    "expandable_segments:False,max_split_size_mb:64,segment_size_mb:4",
)


@dataclass
class Recommendation:
    trace: str
    settings: str | None            # NPUMEM_ALLOC_CONF text ("" = the defaults; None: none fits)
    predicted_peak_reserved_bytes: int
    peak_allocated_bytes: int
    default_peak_reserved_bytes: int
    torch_peak_reserved_bytes: int
    reason: str
    candidates: list[ReplayResult]

    def as_dict(self) -> dict:
        return {"trace": self.trace,
                "settings": "defaults" if self.settings == "" else self.settings,
                "npumem_alloc_conf": self.settings,
                "predicted_peak_reserved_bytes": self.predicted_peak_reserved_bytes,
                "peak_allocated_bytes": self.peak_allocated_bytes,
                "default_peak_reserved_bytes": self.default_peak_reserved_bytes,
                "torch_peak_reserved_bytes": self.torch_peak_reserved_bytes,
                "reason": self.reason,
                "candidates": [{"settings": r.settings, "peak_reserved_bytes": r.peak_reserved_bytes,
                                "device_allocs": r.device_allocs, "oom": r.oom}
                               for r in self.candidates]}


def tune(trace: str, candidates=CANDIDATES, scheduler: str = "processes", workers=None,
         progress=None) -> Recommendation:
    jobs = [ReplayJob(trace, "pool", settings) for settings in candidates]
    jobs.append(ReplayJob(trace, "torch"))
    results = run_jobs(jobs, scheduler, workers, progress)
    torch_result, pool_results = results[-1], results[:-1]
    default = pool_results[list(candidates).index("")] if "" in candidates else pool_results[0]
    ranked = sorted(((result, text) for result, text in zip(pool_results, candidates)
                     if result.oom is None),       # a setting that runs out fits nothing
                    key=lambda pair: (pair[0].peak_reserved_bytes, pair[0].device_allocs,
                                      len(pair[1])))
    if not ranked:
        oom = default.oom
        return Recommendation(trace, None, 0, default.peak_allocated_bytes, 0,
                              torch_result.peak_reserved_bytes,
                              f"no candidate setting replays the trace within the pool's device: "
                              f"{oom['message']} (event {oom['index']:,})", pool_results)
    best, settings = ranked[0]
    live = best.peak_allocated_bytes
    saved = default.peak_reserved_bytes - best.peak_reserved_bytes
    if saved > 0:
        why = (f"{settings_label(settings)} reserves {format_size(saved)} less at peak than the "
               f"defaults ({format_size(best.peak_reserved_bytes)} vs "
               f"{format_size(default.peak_reserved_bytes)})")
    elif settings:              # as low a peak, with fewer device allocations (the tie-break)
        why = (f"{settings_label(settings)} reserves as little at peak as the defaults "
               f"({format_size(best.peak_reserved_bytes)}) with fewer device allocations "
               f"({best.device_allocs} vs {default.device_allocs})")
    else:
        why = (f"the defaults already reserve the least ({format_size(best.peak_reserved_bytes)}); "
               f"the best alternative, {settings_label(ranked[1][1]) if len(ranked) > 1 else '-'}, "
               f"needs {format_size(ranked[1][0].peak_reserved_bytes) if len(ranked) > 1 else '-'}")
    why += (f"; {best.peak_reserved_bytes / live:.3f}x the peak live {format_size(live)}, "
            f"where PyTorch's policy reserves {format_size(torch_result.peak_reserved_bytes)} "
            f"({torch_result.peak_reserved_bytes / live:.3f}x)") if live else ""
    return Recommendation(trace, settings, best.peak_reserved_bytes, live,
                          default.peak_reserved_bytes, torch_result.peak_reserved_bytes, why,
                          pool_results)
