"""A launch's per-core timeline: what each transfer engine and compute unit did, and when.

Times are in the profile's cycles from the launch's start. Every core has five lanes: MTE2 (global
memory in), MTE1 (L1 to L0), Cube, Vector and MTE3 (out to global memory). A core is busy while
any of its lanes is; utilisation is the cores' busy time over cores x makespan, the measure the
load-balancing bench reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profile import Profile

LANES = ("MTE2", "MTE1", "Cube", "Vector", "MTE3")


@dataclass
class Slice:
    block: int
    core: int
    lane: str
    name: str
    start: float
    end: float
    nbytes: int = 0
    tile: int | None = None


class Timeline:
    def __init__(self, kernel: str, profile: Profile, block_dim: int, cores: int):
        self.kernel, self.profile = kernel, profile
        self.block_dim, self.cores = block_dim, cores
        self.slices: list[Slice] = []

    def add(self, piece: Slice) -> None:
        self.slices.append(piece)

    @property
    def makespan(self) -> float:
        """Cycles from the launch's start to its last instruction's end."""
        return max((s.end for s in self.slices), default=0.0)

    def busy(self, core: int) -> float:
        """Cycles during which at least one lane of `core` worked."""
        intervals = sorted((s.start, s.end) for s in self.slices if s.core == core)
        total, reach = 0.0, float("-inf")
        for start, end in intervals:
            if end <= reach:
                continue
            total += end - max(start, reach)
            reach = end
        return total

    def utilisation(self) -> float:
        """Busy time of every core over cores x makespan (1.0: no core ever waited)."""
        span = self.makespan
        if not span:
            return 0.0
        return sum(self.busy(core) for core in range(self.cores)) / (self.cores * span)

    def lane_cycles(self) -> dict[str, float]:
        totals = dict.fromkeys(LANES, 0.0)
        for s in self.slices:
            totals[s.lane] += s.end - s.start
        return totals

    def overlap(self, core: int = 0) -> float:
        """Share of `core`'s compute time during which a transfer ran too (double buffering
        shows here: 0 means copies and compute took turns)."""
        compute = [(s.start, s.end) for s in self.slices
                   if s.core == core and s.lane in ("Vector", "Cube")]
        copies = [(s.start, s.end) for s in self.slices
                  if s.core == core and s.lane in ("MTE2", "MTE3")]
        total = sum(end - start for start, end in compute)
        if not total:
            return 0.0
        shared = sum(max(0.0, min(e1, e2) - max(s1, s2))
                     for s1, e1 in compute for s2, e2 in copies)
        return min(1.0, shared / total)

    def microseconds(self, cycles: float) -> float:
        return self.profile.microseconds(cycles)

    def summary(self) -> str:
        lanes = self.lane_cycles()
        used = ", ".join(f"{lane} {self.microseconds(c):.2f} us" for lane, c in lanes.items() if c)
        return (f"kernel {self.kernel}: {self.block_dim} block(s) on {self.cores} core(s) of "
                f"{self.profile.name}, makespan {self.microseconds(self.makespan):.2f} us "
                f"({self.makespan:.0f} cycles), utilisation {self.utilisation():.1%}; lanes "
                f"{used or 'idle'}")

    def chrome_events(self, pid: int | str, start_us: float = 0.0) -> list[dict]:
        """Chrome trace events: one thread per core and lane, named "core 3 MTE2"."""
        events, named = [], set()
        for s in self.slices:
            tid = s.core * len(LANES) + LANES.index(s.lane)
            if tid not in named:
                named.add(tid)
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": f"core {s.core} {s.lane}"}})
            events.append({"ph": "X", "name": s.name, "cat": "aicore", "pid": pid, "tid": tid,
                           "ts": start_us + self.microseconds(s.start),
                           "dur": max(self.microseconds(s.end - s.start), 0.001),
                           "args": {"block": s.block, "tile": s.tile, "bytes": s.nbytes}})
        return events
