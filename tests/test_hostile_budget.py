"""Hostile files of issue 64, each run through every verb in a child process watched for RSS
and CPU time: a crash, a traceback or a file that eats memory or time fails the test instead
of taking the machine or the run with it.

The budget (docs/reliability.md): a file of a few KB ends within a few seconds and 100 MiB
above what the process held before it read the file, however large the addresses, sizes and
counts written in it.
"""

import os
import pickle

import pytest

from .fuzzing import (_as_jsonl_snapshot, expandable_giant, overlapping_segments,
                      surrogate_pickles)
from .hostile_runs import run

BUDGET_MIB = 100          # RSS above the parent's, which the forked child starts with
CPU_SECONDS = 20          # generous: the machine may be shared; the files take well under 1 s


def _parent_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _ends_cleanly(verb: str, path: str):
    base = _parent_rss_mib()
    ended = run(verb, path, memory=(int(base) + 4 * BUDGET_MIB) << 20, seconds=CPU_SECONDS)
    assert ended.clean, str(ended) + "\n" + ended.stderr[-2000:]
    assert "out of host memory" not in ended.stderr, str(ended)
    assert ended.rss_mib - base < BUDGET_MIB, f"{ended} (the parent held {base:.0f} MiB)"
    return ended


@pytest.mark.parametrize("index", range(len(surrogate_pickles())))
def test_a_name_with_no_utf8_form_is_refused_not_a_segfault(tmp_path, index):
    """The 12-byte pickle killed report, replay --check and tune with SIGSEGV: the refusal
    formatted PyUnicode_AsUTF8's NULL. Each sibling (both names, the name alone, GLOBAL's raw
    bytes, NUL, every string opcode, a memoized name, a number for a name) is one line."""
    path = tmp_path / "class.pickle"
    path.write_bytes(surrogate_pickles()[index])
    for verb in (["report", "replay --check", "tune"] if index == 0 else ["report"]):
        ended = _ends_cleanly(verb, str(path))
        assert ended.status == 2 and "it asks for" in ended.stderr, str(ended)
        assert ended.stderr.count("\n") == 1, ended.stderr
    if index == 0:
        assert "it asks for \\udcff.x" in ended.stderr


VERBS = ["report", "replay", "replay --check", "convert", "diff", "tune"]


@pytest.mark.parametrize("form", ["pickle", "jsonl"])
def test_a_giant_expandable_range_costs_what_the_file_holds(tmp_path, form):
    """A 2**47-byte mapped range near 2**62 with a recorded OOM: the model kept a list entry
    per 2 MiB page (2**26 of them), and report and tune ran past 30 s and hundreds of MiB."""
    path = tmp_path / f"giant.{form}"
    data = expandable_giant()
    path.write_bytes(pickle.dumps(data) if form == "pickle" else _as_jsonl_snapshot(data))
    for verb in VERBS:
        ended = _ends_cleanly(verb, str(path))
        assert ended.status in (0, 1), str(ended)          # (1: --check's divergence)


def test_segments_that_overlap_at_the_start_are_refused_in_one_line(tmp_path):
    path = tmp_path / "overlap.pickle"
    path.write_bytes(pickle.dumps(overlapping_segments()))
    for verb in VERBS:
        ended = _ends_cleanly(verb, str(path))
        assert ended.status == 2 and "overlaps the one before it" in ended.stderr, str(ended)
        assert "0x400" in ended.stderr and str(path) in ended.stderr


def test_a_range_past_the_address_space_is_refused_naming_the_entry(tmp_path):
    data = overlapping_segments()
    data["device_traces"][0].insert(2, {"action": "free_completed", "addr": (1 << 64) - 512,
                                        "size": 1024, "stream": 0})
    path = tmp_path / "wraps.pickle"
    path.write_bytes(pickle.dumps(data))
    for verb in VERBS:
        ended = _ends_cleanly(verb, str(path))
        assert ended.status == 2 and "entry 2: a free_completed of 1024 bytes" in ended.stderr
        assert "past the end of the 64-bit address space" in ended.stderr


def test_a_plan_whose_sizes_sum_past_int64_is_refused(tmp_path):
    """33,000 rows of 2**48 bytes, all live at once: an OverflowError in the sweep."""
    path = tmp_path / "plan.csv"
    path.write_text("id,lower,upper,size\n" + "".join(f"b{i},0,10,{1 << 48}\n"
                                                      for i in range(33000)))
    ended = _ends_cleanly("plan", str(path))
    assert ended.status == 2 and f"{path}:8194: buffer b8192: the sizes up to here sum" in \
        ended.stderr, str(ended)


def _strings_that_do_not_encode() -> list[tuple[str, bytes]]:
    """Files whose names, keys and values hold lone surrogates or bytes no UTF-8 decodes,
    where a message would show them: every C reader's path to a message."""
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0}
    return [
        ("jsonl", b'{"t_us": 0, "action": "\\udcff", "addr": 4096, "size": 512, "stream": 0}\n'),
        ("jsonl", b'{"t_us": 0, "action": "all\xed\xb3\xbfoc", "addr": 4096, "size": 512}\n'),
        ("jsonl", b'{"t_us": 0, "action": "alloc", "addr": 4096, "size": 512, "\xff": 1}\n'),
        ("pickle", pickle.dumps({"segments": [], "device_traces": [[{**entry,
                                                                     "action": "\udcff"}]]})),
        ("pickle", pickle.dumps({"segments": [], "device_traces": [[{**entry,
                                                                     "\udcff": 1}]]})),
        ("pickle", pickle.dumps({"segments": [], "device_traces": [[{**entry, "frames": [
            {"filename": "\udcff.py", "line": "\udcff", "name": "x"}]}]]})),
        ("pickle", pickle.dumps({"\udcff": [], "\ud800": 1})),
    ]


@pytest.mark.parametrize("index", range(len(_strings_that_do_not_encode())))
def test_strings_that_do_not_encode_reach_messages_escaped(tmp_path, index):
    form, data = _strings_that_do_not_encode()[index]
    path = tmp_path / f"strings.{form}"
    path.write_bytes(data)
    for verb in ("report", "replay") if form == "jsonl" else ("report",):
        ended = _ends_cleanly(verb, str(path))       # (a key npumem does not use: read as is)
        assert ended.status == 0 or (ended.status == 2 and ended.stderr.count("\n") == 1), \
            str(ended)


def test_segments_past_int64_together_are_refused_not_an_overflow(tmp_path):
    """Two dump segments of nearly 2**63 bytes each: the report's running total of reserved
    bytes raised OverflowError (columns.levels)."""
    def segment(addr, size):
        return {"device": 0, "address": addr, "total_size": size, "stream": 0,
                "segment_type": "large", "allocated_size": 0, "active_size": 0,
                "requested_size": 0, "is_expandable": False,
                "blocks": [{"address": addr, "size": size, "state": "inactive"}]}
    trace = [{"action": "alloc", "addr": 4096, "size": 512, "stream": 0},
             {"action": "free_completed", "addr": 4096, "size": 512, "stream": 0}]
    path = tmp_path / "sums.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment(4096, (1 << 63) - 8192),
                                                segment(1 << 63, (1 << 63) - 4096)],
                                   "device_traces": [trace]}))
    for verb in ("report", "replay", "tune"):
        ended = _ends_cleanly(verb, str(path))
        assert ended.status == 2 and "more than any device holds (2**48)" in ended.stderr


def test_a_pool_replay_of_an_allocation_past_int64_is_refused(tmp_path):
    """A recorded 2**64 - 1 byte allocation reached the pool's C free list (OverflowError)."""
    path = tmp_path / "huge.jsonl"
    path.write_text('{"t_us": 0, "action": "alloc", "addr": 0, "size": 512, "stream": 0}\n'
                    '{"t_us": 1, "action": "alloc", "addr": 4096, "size": 18446744073709551615,'
                    ' "stream": 0}\n')
    for verb in ("replay --allocator pool", "replay", "tune"):
        ended = _ends_cleanly(verb, str(path))
        assert ended.status == 2 and "more than any device holds" in ended.stderr, str(ended)
