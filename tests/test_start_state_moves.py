"""The first move of each address in a trace (start_state.first_moves): the C reader's one pass
with a hash of addresses against its Python statement, and against walking the trace back from
the dump one block at a time; the real recordings' start states read alike through both."""

import gzip
import pathlib
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumem.trace.snapshot import recording_from_data, start_state
from npumem.trace.snapshot.columns import ACTIONS, ALLOC, arrays, native

DATA = pathlib.Path(__file__).parent / "data"
CODES = [ACTIONS.index(name) for name in ("alloc", "free_requested", "free_completed",
                                          "segment_alloc", "snapshot")]


class _Trace:
    """What first_moves reads of an Arrays: action codes and addresses."""

    def __init__(self, action, addr):
        self.action, self.addr = action, addr


def _walked_back(actions, addrs, free_code, at_dump):
    """The rule as it is stated: undo the moves last first from the dump's live addresses."""
    live, inconsistent, first = set(at_dump), 0, {}
    for position in reversed(range(len(actions))):
        code, addr = actions[position], addrs[position]
        if code not in (ALLOC, free_code):
            continue
        if code == ALLOC:
            inconsistent += addr not in live
            live.discard(addr)
        else:
            inconsistent += addr in live
            live.add(addr)
        first[addr] = (code, position)
    freed = sorted(position for code, position in first.values() if code != ALLOC)
    allocated = {addr for addr, (code, _) in first.items() if code == ALLOC}
    return freed, allocated, inconsistent


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CODES), st.integers(0, 12)), max_size=80),
       st.sets(st.integers(0, 14), max_size=6), st.sampled_from(["free_requested",
                                                                   "free_completed"]),
       st.sampled_from([0, 2**64 - 16]))
def test_one_pass_finds_what_walking_back_finds(moves, at_dump, free_action, base):
    actions = [code for code, _ in moves]
    addrs = [base + addr for _, addr in moves]
    dump = sorted(base + addr for addr in at_dump)
    free_code = ACTIONS.index(free_action)
    expected = _walked_back(actions, addrs, free_code, dump)
    trace = _Trace(np.array(actions, np.uint8), np.array(addrs, np.uint64))
    for found in (start_state.first_moves(trace, free_action, dump),
                  start_state._first_moves(actions, addrs, free_code, dump)):
        freed, allocated, inconsistent = found
        assert (freed.tolist(), set(allocated), inconsistent) == expected
        assert len(allocated) == len(set(allocated))


def test_numbers_past_64_bits_take_the_python_statement():
    actions = [ACTIONS.index("free_completed"), ALLOC]
    addrs = [2**70, 2**70]
    trace = _Trace(np.array(actions, np.uint8), np.array(addrs, dtype=object))
    assert start_state.first_moves(trace, "free_completed", [2**70]) == \
        start_state._first_moves(actions, addrs, actions[0], [2**70])
    freed, allocated, inconsistent = start_state.first_moves(
        _Trace(np.array([ALLOC], np.uint8), np.array([5], np.uint64)), "free_completed", [2**70])
    assert (freed.tolist(), allocated, inconsistent) == ([], [5], 1)


@pytest.mark.skipif(native is None, reason="the C reader is not built")
def test_bad_columns_are_refused():
    with pytest.raises(ValueError, match="different lengths"):
        native.first_moves(np.zeros(3, np.uint8), np.zeros(2, np.uint64), ALLOC, 2,
                           np.zeros(0, np.uint64))


@pytest.mark.parametrize("name", ["gpt_train", "unet", "lstm"])
def test_a_real_recordings_start_state_is_the_same_through_both(name, monkeypatch):
    data = pickle.loads(gzip.decompress((DATA / "cuda_snapshots" / f"{name}.pickle.gz")
                                        .read_bytes()))
    recording = recording_from_data(data)
    native_start = recording.start_state()
    monkeypatch.setattr(start_state, "native", None)
    python_start = recording_from_data(data).start_state()
    assert native_start == python_start
    assert native_start.live and len(arrays(recording.entries))
