"""Sharing work items among AI cores: uniform, or workload-aware (seed 004 §3.4).

`uniform` gives each core an equal run of consecutive items, which is what a kernel that splits
its rows by block index does. `balanced` sorts the items by their estimated cost and gives each
to the core with the least work so far (greedy largest-first, LPT), so a few expensive items
(dense rows of a sparse matrix, long sequences of a ragged batch) do not leave the other cores
idle. Estimates only need to rank and weigh the items: for a sparse MatMul, the number of
non-empty K blocks of each row block.
"""

from __future__ import annotations

import heapq

from ..errors import InvalidParamError

POLICIES = ("uniform", "balanced")


def partition(costs: list[float], cores: int, policy: str = "balanced") -> list[list[int]]:
    """Item indices for each of `cores` cores, by `policy`."""
    if cores < 1:
        raise InvalidParamError(f"partition over {cores} cores: need at least one")
    if policy == "uniform":
        count = len(costs)
        return [list(range(core * count // cores, (core + 1) * count // cores))
                for core in range(cores)]
    if policy != "balanced":
        raise InvalidParamError(f"partition policy {policy!r}: choose {' or '.join(POLICIES)}")
    shares: list[list[int]] = [[] for _ in range(cores)]
    loads = [(0.0, core) for core in range(cores)]            # a heap of (load, core)
    for item in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, core = heapq.heappop(loads)
        shares[core].append(item)
        heapq.heappush(loads, (load + costs[item], core))
    for share in shares:
        share.sort()                    # each core walks its items in memory order
    return shares

