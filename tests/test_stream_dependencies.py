"""Cross-stream waits: wait-before-record, deadlocks refused with the cycle, timeouts that say why."""

import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import npumem
from npumem import errors as E


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



@pytest.fixture
def op_wait_timeout(rt):
    """A deadlock the detector missed fails the test in 5 s instead of hanging it."""
    npumem.set_op_wait_timeout(5)
    yield
    npumem.set_op_wait_timeout(0)


def test_a_wait_queued_before_the_record_lasts_until_the_record(rt, op_wait_timeout):
    producer, consumer = npumem.create_stream(), npumem.create_stream()
    ready = npumem.create_event()
    ran = threading.Event()
    npumem.stream_wait_event(consumer, ready)
    consumer.enqueue(ran.set, "consumer work")
    assert not ran.wait(0.05)                      # blocked: the event has no record yet
    assert [(d.waiter, d.recorder) for d in npumem.dependencies()] == [(consumer, None)]
    npumem.record_event(ready, producer)
    npumem.synchronize_stream(consumer)
    assert ran.is_set() and npumem.dependencies() == []


def test_a_two_stream_cycle_is_refused_and_nothing_is_lost(rt, op_wait_timeout):
    a, b = npumem.create_stream(), npumem.create_stream()
    a_done, b_done = npumem.create_event(), npumem.create_event()
    npumem.stream_wait_event(a, b_done)            # a waits for b's record ...
    npumem.stream_wait_event(b, a_done)            # ... and b for a's
    npumem.record_event(a_done, a)                 # fine so far: a's record is behind a's wait
    with pytest.raises(E.StreamDeadlockError) as info:
        npumem.record_event(b_done, b)             # would close a -> b -> a
    message = str(info.value)
    assert f"0x{a.handle:x} -> 0x{b.handle:x} -> 0x{a.handle:x}" in message
    assert "nothing was queued" in message and "task #1" in message
    assert info.value.code == E.ACL_ERROR_RT_PARAM_INVALID
    assert len(npumem.dependencies()) == 2         # both waits still pending, a's still unbound
    helper = npumem.create_stream()
    npumem.record_event(b_done, helper)            # a third stream releases the chain
    for stream in (a, b, helper):
        npumem.synchronize_stream(stream)
    assert npumem.dependencies() == []


def test_a_stream_waiting_for_its_own_later_record_is_refused(rt, op_wait_timeout):
    stream = npumem.create_stream()
    event = npumem.create_event()
    npumem.stream_wait_event(stream, event)
    with pytest.raises(E.StreamDeadlockError, match=f"0x{stream.handle:x} -> 0x{stream.handle:x}"):
        npumem.record_event(event, stream)
    npumem.record_event(event, npumem.create_stream())
    npumem.synchronize_stream(stream)


def test_a_three_stream_cycle_names_every_stream(rt, op_wait_timeout):
    s = [npumem.create_stream() for _ in range(3)]
    e = [npumem.create_event() for _ in range(3)]
    for i in range(3):                       # stream i waits for event i, recorded on i+1
        npumem.stream_wait_event(s[i], e[i])
    npumem.record_event(e[0], s[1])
    npumem.record_event(e[1], s[2])
    with pytest.raises(E.StreamDeadlockError) as info:
        npumem.record_event(e[2], s[0])
    for stream in s:
        assert f"0x{stream.handle:x}" in str(info.value)
    npumem.record_event(e[2], npumem.create_stream())
    for stream in s:
        npumem.synchronize_stream(stream)


def test_waiting_for_a_reached_record_never_blocks(rt):
    a, b = npumem.create_stream(), npumem.create_stream()
    event = npumem.create_event()
    npumem.record_event(event, a)
    npumem.synchronize_stream(a)
    npumem.stream_wait_event(b, event)
    npumem.record_event(event, b)                  # no cycle: the wait needs a's old record
    npumem.synchronize_stream(b)


def test_op_wait_timeout_fails_the_wait_and_names_it(rt):
    stream = npumem.create_stream()
    never = npumem.create_event()
    npumem.set_op_wait_timeout(0.05)
    try:
        npumem.stream_wait_event(stream, never)
    finally:
        npumem.set_op_wait_timeout(0)
    with pytest.raises(E.AsyncTaskError, match="op wait timeout") as info:
        npumem.synchronize_stream(stream)
    assert "no record queued yet" in str(info.value)
    assert npumem.dependencies() == []
    npumem.synchronize_stream(stream)              # the stream goes on after the failed wait


def test_synchronize_timeout_says_what_the_stream_waits_for(rt):
    a, b = npumem.create_stream(), npumem.create_stream()
    event = npumem.create_event()
    npumem.stream_wait_event(b, event)
    with pytest.raises(E.StreamNotCompleteError) as info:
        npumem.synchronize_stream(b, timeout=0.05)
    assert f"waits for {event!r}" in str(info.value) and "no record queued yet" in str(info.value)
    npumem.record_event(event, a)
    npumem.synchronize_stream(b)


@pytest.mark.parametrize("seconds", [-1, "5", None, True])
def test_bad_op_wait_timeouts_are_refused(rt, seconds):
    with pytest.raises(E.InvalidParamError, match="seconds must be a number"):
        npumem.set_op_wait_timeout(seconds)


# --- model check: the detector refuses exactly the calls that could never finish -----------


def _finishes(calls) -> bool:
    """Run a list of ("record"|"wait", stream, event) calls on a model of the stream semantics;
    True when every task can run once every event gets one last record on a fresh stream."""
    queues = {}
    records = []                       # (event, stream, position) in call order
    waits = []                         # per wait: (stream, position, event, index in records or None)
    for kind, stream, event in calls:
        queue = queues.setdefault(stream, [])
        if kind == "record":
            records.append((event, stream, len(queue)))
            queue.append(("record", len(records) - 1))
        else:
            latest = max((i for i, r in enumerate(records) if r[0] == event), default=None)
            waits.append([stream, len(queue), event, latest])
            queue.append(("wait", len(waits) - 1))
    for event in {c[2] for c in calls}:      # the final releases
        records.append((event, "fresh", 0))
    for wait in waits:
        if wait[3] is None:                  # waits for the next record of its event
            later = [i for i, r in enumerate(records) if r[0] == wait[2]
                     and _after(calls, r, wait)]
            wait[3] = later[0]
    done = set(("fresh", i) for i, r in enumerate(records) if r[1] == "fresh")
    progress = {s: 0 for s in queues}
    moved = True
    while moved:
        moved = False
        for stream, queue in queues.items():
            while progress[stream] < len(queue):
                kind, index = queue[progress[stream]]
                if kind == "wait" and not _record_done(waits[index][3], records, done):
                    break
                if kind == "record":
                    done.add(("record", index))
                progress[stream] += 1
                moved = True
    return all(progress[s] == len(q) for s, q in queues.items())


def _after(calls, record, wait) -> bool:
    """Was `record` queued after `wait` (both as positions in their streams' call order)?"""
    return record[1] == "fresh" or _call_index(calls, record[1], record[2]) > \
        _call_index(calls, wait[0], wait[1])


def _call_index(calls, stream, position) -> int:
    seen = -1
    for i, (_, s, _) in enumerate(calls):
        if s == stream:
            seen += 1
            if seen == position:
                return i
    raise AssertionError("no such call")


def _record_done(index, records, done) -> bool:
    return ("fresh", index) in done or ("record", index) in done


call = st.tuples(st.sampled_from(["record", "wait"]), st.integers(0, 2), st.integers(0, 2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(call, max_size=10))
def test_the_detector_matches_a_model_of_the_streams(rt, calls):
    npumem.set_op_wait_timeout(5)
    streams = []
    try:
        streams += [npumem.create_stream() for _ in range(3)]
        events = [npumem.create_event() for _ in range(3)]
        accepted = []
        for kind, s, e in calls:
            attempt = accepted + [(kind, s, e)]
            try:
                if kind == "record":
                    npumem.record_event(events[e], streams[s])
                else:
                    npumem.stream_wait_event(streams[s], events[e])
            except E.StreamDeadlockError:
                assert not _finishes(attempt), f"refused a call that could finish: {attempt}"
                continue
            assert _finishes(attempt), f"accepted a deadlock: {attempt}"
            accepted.append((kind, s, e))
        release = npumem.create_stream()
        streams.append(release)
        for event in events:
            npumem.record_event(event, release)
        for stream in streams:
            npumem.synchronize_stream(stream)
        assert npumem.dependencies() == []
    finally:
        npumem.set_op_wait_timeout(0)
        for stream in streams:
            npumem.destroy_stream(stream)


@pytest.mark.parametrize("teardown", ["destroy_stream", "reset_device", "finalize", "destroy_event"])
def test_a_wait_for_an_event_never_recorded_never_hangs_teardown(teardown):
    """Issue 19, item 5: each of these used to block forever."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import npumem
        npumem.init(); npumem.set_device(0)
        s, e = npumem.create_stream(), npumem.create_event()
        npumem.stream_wait_event(s, e)
        try:
            if "{teardown}" == "destroy_stream": npumem.destroy_stream(s)
            elif "{teardown}" == "reset_device": npumem.reset_device(0)
            elif "{teardown}" == "finalize": npumem.finalize()
            else:
                npumem.destroy_event(e)
                npumem.synchronize_stream(s)
        except npumem.errors.AclError as exc:
            print("raised:", exc)
        print("done")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("done")
    assert "was given up" in run.stdout + run.stderr and "never recorded" in run.stdout + run.stderr \
        or "was destroyed before it was recorded" in run.stdout



def test_destroying_a_recorded_event_keeps_its_waits(rt):
    """As cudaEventDestroy: a wait bound to a record already queued still ends when it runs."""
    first, second = rt.create_stream(), rt.create_stream()
    gate = threading.Event()
    first.enqueue(gate.wait, "held until the test says so")
    event = rt.create_event()
    rt.record_event(event, first)
    rt.stream_wait_event(second, event)
    rt.destroy_event(event)
    gate.set()
    rt.synchronize_stream(second)             # no error: the wait ended with the record
    rt.destroy_stream(first)
    rt.destroy_stream(second)
