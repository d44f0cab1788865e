"""The C snapshot reader (trace/snapshot/_reader.c) against Python's own unpickler, the oracle:
the same plain data for any pickle a pickler writes, the same entries as dicts, and the same
refusals for what is not plain data or breaks the entry rule."""

import gzip
import pathlib
import pickle
import pickletools
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumem.trace.snapshot import columns as entry_columns
from npumem.trace.snapshot.columns import EntryError, UnsafePickle, load_pickle, rows
from npumem.trace.file_checks import shown
from npumem.trace.snapshot import load_data


DATA = pathlib.Path(__file__).parent / "data"
PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12) | st.binary(max_size=8),
    lambda inner: (st.lists(inner, max_size=5) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=6) | st.integers(-5, 5), inner, max_size=5)
                   | st.frozensets(st.integers(0, 9), max_size=3)),
    max_leaves=25)

frames = st.lists(st.fixed_dictionaries({"filename": st.sampled_from(["a.py", "b.py", "<x>"]),
                                         "line": st.integers(0, 999),
                                         "name": st.sampled_from(["f", "g", "forward"])}),
                  max_size=4)

entries = st.fixed_dictionaries(
    {"action": st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc",
                                "segment_free", "snapshot"]),
     "addr": st.integers(0, 2**64 - 1), "size": st.integers(0, 2**64 - 1)},
    optional={"stream": st.integers(0, 2**64 - 1),
              "time_us": st.integers(-2**63, 2**63 - 1) | st.floats(-1e18, 1e18),
              "frames": frames, "requested_size": st.integers(0, 2**40),
              "compile_context": st.just("N/A"), "user_metadata": st.sampled_from(["", "tag"]),
              "pool_id": st.tuples(st.integers(0, 9), st.integers(0, 9)),
              "category": st.sampled_from(["activation", "parameter"])})


@settings(max_examples=300, deadline=None)
@given(plain, st.sampled_from(PROTOCOLS))
def test_plain_data_reads_as_pickle_reads_it(value, protocol):
    data = pickle.dumps(value, protocol=protocol)
    if any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(data)):
        # older protocols write sets and bytes as calls (builtins.set, _codecs.encode)
        with pytest.raises(UnsafePickle, match="it asks for"):
            load_pickle(data, shown)
        return
    root, devices, _ = load_pickle(data, shown)
    assert devices == []
    assert root == pickle.loads(data) and type(root) is type(pickle.loads(data))


def _aliasing(value, seen=None) -> object:
    """`value`'s shape with each list and dict named by the order it is first met: two reads
    alias alike when these are equal (pickle.loads keeps a shared list one object)."""
    seen = {} if seen is None else seen
    if isinstance(value, (list, dict)):
        if id(value) in seen:
            return ("again", seen[id(value)])
        seen[id(value)] = len(seen)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return (type(value).__name__, [(k, _aliasing(v, seen)) for k, v in items])
    if isinstance(value, tuple):
        return ("tuple", [_aliasing(v, seen) for v in value])
    return (type(value).__name__, repr(value))


@settings(max_examples=200, deadline=None)
@given(st.lists(plain, min_size=1, max_size=6), st.lists(st.integers(0, 30), max_size=40),
       st.sampled_from(PROTOCOLS))
def test_objects_referred_to_again_read_as_pickle_reads_them(parts, picks, protocol):
    """Lists and dicts named twice stay one object; equal strings may become one (the memo
    keeps a value once), which no reader can tell but by identity."""
    made = [[part] for part in parts] + [{"k": part} for part in parts] + parts
    root = [made[pick % len(made)] for pick in picks] + made
    data = pickle.dumps(root, protocol=protocol)
    if any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(data)):
        return                       # (sets and bytes as calls: refused, tested above)
    read = load_pickle(data, shown)[0]
    expected = pickle.loads(data)
    assert read == expected and _aliasing(read) == _aliasing(expected)


def _shared_frames(traces: list) -> list:
    """The traces as PyTorch's snapshot writes them: equal frames are one object."""
    seen: dict = {}
    for trace in traces:
        for entry in trace:
            if "frames" in entry:
                entry["frames"] = [seen.setdefault(tuple(f.items()), f) for f in entry["frames"]]
    return traces


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(entries, max_size=30), min_size=1, max_size=3),
       st.sampled_from(PROTOCOLS), st.booleans(), st.sampled_from([None, 1, 3, 64]))
def test_entries_read_into_columns_are_the_entries_pickle_reads(traces, protocol, share, window):
    """From bytes, and from a file read `window` bytes at a time."""
    import io
    if share:
        traces = _shared_frames(traces)
    snapshot = {"segments": [], "device_traces": traces, "allocator_settings": {"x": 1}}
    data = pickle.dumps(snapshot, protocol=protocol)
    if window is not None:
        from npumem.trace.snapshot import _reader as native
        _same_read(native.load(io.BytesIO(data), window), native.load(data))
    root, devices, _ = load_pickle(data, shown)
    expected = pickle.loads(data)
    assert root["allocator_settings"] == {"x": 1}
    assert [list(device) for device in devices] == expected["device_traces"]
    for device, trace in zip(devices, expected["device_traces"]):
        for row, entry in zip(rows(device), trace):
            assert row[:3] == (entry["action"], entry["addr"], entry["size"])
            assert row[4] == float(entry.get("time_us", 0))
            assert row[6].get("pool_id") == entry.get("pool_id")
    columns, _ = entry_columns.from_entry_lists(expected["device_traces"], shown)
    assert [list(c) for c in columns] == expected["device_traces"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_projects_gpu_recordings_read_the_same(protocol):
    for path in sorted((DATA / "cuda_snapshots").glob("*.pickle.gz"))[:3]:
        expected = pickle.loads(gzip.decompress(path.read_bytes()))
        root, devices, tables = load_pickle(pickle.dumps(expected, protocol=protocol), shown)
        assert [list(d) for d in devices] == expected["device_traces"]
        assert {k: v for k, v in root.items() if k != "device_traces"} == \
            {k: v for k, v in expected.items() if k != "device_traces"}
        assert len(tables.stacks) < len(devices[0]) / 10        # stacks interned


SHARED = DATA.parents[2] / "shared" / "data" / "snapshots"


def _as_recorded(path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


@pytest.mark.parametrize("folder", ["cuda_snapshots", "cuda_snapshots_h200", "cuda_oom_h200",
                                    "shared"])
def test_recordings_others_wrote_read_the_same_as_pickle_reads_them(folder):
    """The bytes as PyTorch's users pickled them (not re-pickled here): the project's GPU
    recordings, and the real users' snapshots of ../shared where it is beside the checkout."""
    root = SHARED if folder == "shared" else DATA / folder
    paths = sorted(root.rglob("*.pickle*"))[:25]
    if not paths:
        pytest.skip(f"no recordings in {root}")
    for path in paths:
        data = _as_recorded(path)
        expected = pickle.loads(data)
        got, devices, _ = load_pickle(data, shown)
        assert [list(d) for d in devices] == expected["device_traces"], path
        assert {k: v for k, v in got.items() if k != "device_traces"} == \
            {k: v for k, v in expected.items() if k != "device_traces"}, path


@pytest.mark.parametrize("value, where, words", [
    ({"action": "alloc", "addr": -1, "size": 1}, "[0][1].addr", "an integer in [0, 2**64)"),
    ({"action": "alloc", "addr": 2**64, "size": 1}, "[0][1].addr", "an integer in [0, 2**64)"),
    ({"action": "alloc", "addr": True, "size": 1}, "[0][1].addr", "got True"),
    ({"action": "alloc", "addr": 1}, "[0][1].size", "got None"),
    ({"action": "sneeze", "addr": 1, "size": 1}, "[0][1].action", "unknown action 'sneeze'"),
    ({"action": 3}, "[0][1]", "a dict with an action"),
    ({"action": "alloc", "addr": 1, "size": 1, "time_us": float("nan")}, "[0][1].time_us",
     "finite number"),
    ({"action": "alloc", "addr": 1, "size": 1, "time_us": 10**400}, "[0][1].time_us",
     "finite number"),
    ({"action": "alloc", "addr": 1, "size": 1, "frames": "x"}, "[0][1].frames", "a list"),
    ({"action": "alloc", "addr": 1, "size": 1, "frames": [{"line": "7"}]},
     "[0][1].frames[0].line", "an integer"),
    ({"action": "alloc", "addr": 1, "size": 1, "pool_id": (1,)}, "[0][1].pool_id", "a pair"),
    ({"action": "oom", "size": 1}, "[0][1].device_free", "an integer"),
    ("not a dict", "[0][1]", "a dict with an action"),
])
@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_wrong_entry_is_named_with_its_field(value, where, words, protocol):
    good = {"action": "alloc", "addr": 1, "size": 1}
    data = pickle.dumps({"segments": [], "device_traces": [[good, value]]}, protocol=protocol)
    with pytest.raises(EntryError) as caught:
        load_pickle(data, shown)
    assert caught.value.where == "device_traces" + where and words in caught.value.reason, \
        str(caught.value)


class _Code:
    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.parametrize("data, words", [
    (pickle.dumps({"segments": [], "device_traces": [[]], "x": _Code()}), "builtins.print"),
    (pickle.dumps({"x": _Code()}, protocol=0), "__builtin__.print"),
    (b"\x80\x02]r\xff\xff\xff\x7f.", "memo index 2147483647"),
    (b"\x80\x02h\x05.", "never set"),
    (b"\x80\x02]", "truncated"),
    (b"\x80\x02}(K\x01.", "damaged"),
    (b"\x80\x02\x8a\xff" + b"\x01" * 10, "truncated"),
    (b"\x80\x09N.", "protocol 9"),
    (b"\xff", "not one"),
    (b"\x80\x04\x8f\x94(\x8f\x90.", "unhashable set item"),       # found by the fuzzer
    (b"\x80\x04(]\x91.", "unhashable set item"),
])
def test_what_is_not_plain_data_is_refused(data, words):
    with pytest.raises(UnsafePickle, match=words.replace("[", r"\[").replace(".", r"\.")):
        load_pickle(data, shown)


def test_an_entry_referred_to_again_is_refused():
    entry = {"action": "alloc", "addr": 1, "size": 1}
    data = pickle.dumps({"segments": [], "device_traces": [[entry, entry]], "again": entry})
    with pytest.raises(UnsafePickle, match="refers back to a trace entry"):
        load_pickle(data, shown)


def _text(value: str) -> bytes:
    return b"X" + len(value).to_bytes(4, "little") + value.encode()


def test_a_frame_changed_after_its_entry_was_read_is_still_refused(tmp_path):
    """A hostile pickle can set a frame's field after the entry using it was checked: the
    stacks are checked again as the reader left them."""
    frame = (b"}q\x01(" + _text("filename") + _text("a.py") + _text("line") + b"K\x01"
             + _text("name") + _text("f") + b"u")
    entry = (b"}(" + _text("action") + _text("alloc") + _text("addr") + b"K\x01" + _text("size")
             + b"K\x01" + _text("frames") + b"]" + frame + b"au")
    data = (b"\x80\x02}(" + _text("segments") + b"]" + _text("device_traces") + b"]]" + entry
            + b"aau" + b"h\x01" + _text("line") + _text("x") + b"s0.")
    assert pickle.loads(data)["device_traces"][0][0]["frames"][0]["line"] == "x"
    path = tmp_path / "changed.pickle"
    path.write_bytes(data)
    with pytest.raises(Exception, match="line: must be an integer"):
        load_data(str(path))


def test_stacks_past_the_limit_are_cut_and_a_shared_huge_stack_costs_once():
    huge = [{"filename": "a.py", "line": i, "name": "f"} for i in range(100_000)]
    trace = [{"action": "alloc", "addr": i, "size": 1, "frames": huge} for i in range(2_000)]
    root, devices, tables = load_pickle(pickle.dumps({"segments": [], "device_traces": [trace]}),
                                        shown)
    assert tables.cut == 1 and len(tables.stacks) == 1
    assert len(devices[0][1999]["frames"]) == entry_columns.MAX_FRAMES


def _snapshot_of_one_stack(entries: int, copied: bool) -> bytes:
    """Entries that all name the same six frames: one set of objects (as PyTorch writes them),
    or a copy each, its own dicts and strings, which pickle.dump memoizes one by one."""
    def frames() -> list:
        return [{"filename": "".join(["model", ".py"]), "line": i,
                 "name": "".join(["for", "ward"])} for i in range(6)]
    shared = frames()
    trace = [{"action": "alloc", "addr": i, "size": 512, "frames": frames() if copied else shared}
             for i in range(entries)]
    return pickle.dumps({"segments": [], "device_traces": [trace]})


def test_a_writer_that_copies_every_frame_costs_little_more_than_one_that_shares_them():
    """The memo keeps each distinct value once: a copied frame is the kept one once its entry
    is a row. (Before, the memo held every copy: about 2 KB an entry here.)"""
    import tracemalloc
    entries, peaks = 20_000, {}
    for copied in (False, True):
        data = _snapshot_of_one_stack(entries, copied)
        tracemalloc.start()
        try:
            _, devices, tables = load_pickle(data, shown)
            peaks[copied] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(tables.stacks) == 1 and len(devices[0]) == entries
        assert devices[0][entries - 1]["frames"] == pickle.loads(data)["device_traces"][0][0][
            "frames"]
    assert (peaks[True] - peaks[False]) / entries < 500, peaks


def test_the_memo_keeps_what_a_pickle_refers_to_again_as_pickle_does():
    """Lists and dicts referred to again are the same object; a memo index set twice names its
    second object; equal strings and tuples may be one object, with the same values."""
    frame = {"filename": "a.py", "line": 1, "name": "f"}
    stack = [frame, dict(frame)]
    trace = [{"action": "alloc", "addr": 1, "size": 1, "frames": stack},
             {"action": "alloc", "addr": 2, "size": 1, "frames": list(stack)}]
    again = ["".join("ab"), ("x", 1, None), ("x", 1.0, True)]
    value = {"segments": [], "device_traces": [trace], "stack": stack, "frame": frame,
             "again": again + again}
    data = pickle.dumps(value)
    root, devices, _ = load_pickle(data, shown)
    expected = pickle.loads(data)
    assert root == {**expected, "device_traces": root["device_traces"]}
    assert root["stack"][0] is root["frame"]
    assert [type(item) for item in root["again"][2]] == [str, float, bool]
    assert [list(device) for device in devices] == expected["device_traces"]
    # PUT 0 twice: GET 0 gives the second list, and the first is let go
    data = b"\x80\x02](]q\x00K\x01a]q\x00K\x02ah\x00e."
    assert pickle.loads(data) == [[1], [2], [2]]
    assert load_pickle(data, shown)[0] == [[1], [2], [2]]


def test_values_kept_once_are_only_strings_and_pool_ids_and_let_go_with_their_index():
    """Equal strings and small pairs of ints become one object; pairs of ints that hash alike
    (ints hash modulo 2**61 - 1) stay apart, so a file cannot make each lookup a long walk; a
    memo index set again and again with new strings keeps none of the old ones."""
    import tracemalloc
    wide = 2**61 - 1
    values = [tuple(made) for made in ([1, 2], [1, 2], ["aaa"], ["aaa"], [wide, 0], [wide, 0])]
    values[4:4] = ["".join(["ab", "ab"]) for _ in range(2)]      # (objects of their own)
    assert values[0] is not values[1] and values[4] is not values[5]
    root = load_pickle(pickle.dumps(values), shown)[0]
    assert root == values and root[0] is root[1] and root[4] is root[5]
    assert root[2] is not root[3] and root[6] is not root[7]
    overwritten = b"\x80\x04N" + b"".join(b"\x8c\x06" + b"%06d" % i + b"q\x000"
                                            for i in range(100_000)) + b"."
    tracemalloc.start()
    try:
        load_pickle(overwritten, shown)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_a_frame_is_only_taken_for_the_kept_one_when_it_is_the_same_dict():
    """Stacks are interned by content, where 1 equals 1.0 and key order does not count: a frame
    referred to again later reads as pickle.loads reads it, type and key order included."""
    f1 = {"filename": "a.py", "line": 1, "name": "f", "x": 1}
    f2 = {**f1, "x": 1.0}
    f3 = {"name": "f", "line": 1, "filename": "a.py"}
    f4 = {"filename": "a.py", "line": 1, "name": "f"}
    trace = [{"action": "alloc", "addr": 1, "size": 1, "frames": [f1, f4]},
             {"action": "alloc", "addr": 2, "size": 1, "frames": [f2, f3]}]
    data = pickle.dumps({"device_traces": [trace], "after": [f2, f3, f4]})
    after = load_pickle(data, shown)[0]["after"]
    expected = pickle.loads(data)["after"]
    assert after == expected and after[1] is not after[2]
    assert [list(frame.items()) for frame in after] == [list(f.items()) for f in expected]
    assert type(after[0]["x"]) is float


def test_frames_with_lines_that_hash_alike_are_not_interned_by_content():
    wide = 2**61 - 1
    def trace(line):
        return [{"action": "alloc", "addr": i, "size": 1,
                 "frames": [{"filename": "a.py", "line": line, "name": "f"}]} for i in range(3)]
    for line, stacks in ((7, 1), (5 * wide, 3)):
        _, devices, tables = load_pickle(pickle.dumps({"device_traces": [trace(line)]}), shown)
        assert len(tables.stacks) == stacks
        assert devices[0][2]["frames"] == [{"filename": "a.py", "line": line, "name": "f"}]


def test_random_damage_never_crashes_the_reader():
    """Truncations and byte flips of a real recording: a clean refusal or plain data."""
    data = pickle.dumps(pickle.loads(gzip.decompress(
        (DATA / "cuda_snapshots" / "mlp.pickle.gz").read_bytes())), protocol=4)
    generator = random.Random(7)
    for _ in range(400):
        damaged = bytearray(data[:generator.randrange(1, len(data))] if generator.random() < 0.3
                            else data)
        for _ in range(generator.randrange(1, 6)):
            damaged[generator.randrange(len(damaged))] = generator.randrange(256)
        try:
            load_pickle(bytes(damaged), shown)
        except (UnsafePickle, EntryError):
            pass


def test_the_python_side_states_what_the_reader_does():
    from npumem.trace.snapshot import _reader as native

    assert entry_columns.ACTIONS == native.ACTIONS
    assert entry_columns.MAX_FRAMES == native.MAX_FRAMES


def test_without_the_c_extensions_other_traces_replay_through_the_python_model():
    """A checkout run without `pip install -e .`: JSONL and the like still replay through the
    model of PyTorch's allocator (a trace held as dicts, the Python model)."""
    for missing in ("'npumem.trace.snapshot._reader', 'npumem.alloc.torch_model._native'",
                    "'npumem.trace._jsonl'", "'npumem.trace._jsonl', 'npumem.trace.snapshot._reader'"):
        script = ("import sys\n"
                  f"for name in ({missing},):\n"
                  "    sys.modules[name] = None\n"
                  "from npumem.cli import main\n"
                  "main(['replay', '--allocator', 'torch', sys.argv[1]])\n")
        done = subprocess.run([sys.executable, "-c", script,
                               "tests/data/cpu_recordings/mlp_12_steps.jsonl.gz"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (missing, done.stderr)
        assert "mlp_12_steps.jsonl.gz" in done.stdout and " 3,016 " in done.stdout, done.stdout


def test_without_the_built_reader_npumem_works_and_a_snapshot_is_one_clear_line(tmp_path):
    """A checkout run without `pip install -e .`: everything but reading a pickle works."""
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    script = ("import sys\n"
              "sys.modules['npumem.trace.snapshot._reader'] = None\n"
              "from npumem.cli import main\n"
              "main(['report', sys.argv[1]])\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "pip install -e ." in done.stderr, done.stderr


# --- entries read as rows without a dict: the layouts pickle.dump writes, and the ones it never
# writes (refused, or read as pickle reads them)

def _entry(*pairs: bytes) -> bytes:
    """An entry as pickle.dump writes one (EMPTY_DICT, MARK, key value ..., SETITEMS)."""
    return b"}(" + b"".join(pairs) + b"u"


_GOOD = (_text("action") + _text("alloc") + _text("addr") + b"K\x01" + _text("size") + b"K\x01")


def _snapshot(device_list: bytes) -> bytes:
    """A snapshot whose device_traces holds one list, built by `device_list` (after `]`)."""
    return (b"\x80\x02}(" + _text("segments") + b"]" + _text("device_traces") + b"]]"
            + device_list + b"au.")


@pytest.mark.parametrize("device_list, words", [
    (b"(" + _entry(_GOOD) + b"2e", "copies a trace entry"),
    (b"(" + _entry(_GOOD) + b"0e", "never reach its list"),
    (b"(" + _entry(_GOOD) + b"}0(" + _text("stream") + b"K\x01ue", "filled after the next"),
    (b"(" + _entry(_GOOD) + b"(" + _GOOD + b"d" + _entry(_GOOD) + b"e", "mixes entries"),
    (b"((" + _GOOD + b"d" + _entry(_GOOD) + b"e", "mixes entries"),     # a DICT op, then a row
])
def test_entry_layouts_no_pickler_writes_are_refused(device_list, words):
    data = _snapshot(device_list)
    pickle.loads(data)                          # plain data to Python's unpickler
    with pytest.raises(UnsafePickle, match=words):
        load_pickle(data, shown)


@pytest.mark.parametrize("device_list", [
    b"(" + _entry(_GOOD, _text("size") + b"K\x07") + b"e",               # a key set twice
    b"(" + _entry(_GOOD, _text("x") + b"K\x01", _text("x") + b"K\x02") + b"e",
    b"(" + _entry(_GOOD, b"K\x05K\x07") + b"e",                           # a key not a str
    b"(" + _entry(_GOOD) + b"}(" + _text("action") + _text("alloc") + b"u" + b"(" + _text("addr")
    + b"K\x02" + _text("size") + b"K\x03ue",                             # filled in two steps
    _entry(_GOOD) + b"a" + _entry(_GOOD) + b"a",                           # APPEND, one by one
])
def test_entries_written_unusually_read_as_pickle_reads_them(device_list):
    data = _snapshot(device_list)
    _, devices, _ = load_pickle(data, shown)
    assert [list(device) for device in devices] == pickle.loads(data)["device_traces"]


def _same_read(a, b) -> None:
    (root_a, (devices_a, *tables_a)), (root_b, (devices_b, *tables_b)) = a, b
    assert root_a == root_b and tables_a == tables_b
    assert [{k: v and bytes(v) for k, v in d.items()} for d in devices_a] == \
        [{k: v and bytes(v) for k, v in d.items()} for d in devices_b]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("window", [1, 7, 64])
def test_a_file_read_a_window_at_a_time_reads_as_its_bytes(protocol, window):
    """Every op crosses a window's end somewhere: lines (protocol 0), strings longer than the
    window (it grows), and entries read as rows."""
    import io
    from npumem.trace.snapshot import _reader as native
    path = sorted((DATA / "cuda_snapshots").glob("*.pickle.gz"))[0]
    data = pickle.dumps(pickle.loads(gzip.decompress(path.read_bytes())), protocol=protocol)
    _same_read(native.load(io.BytesIO(data), window), native.load(data))


@pytest.mark.parametrize("folder", ["cuda_snapshots", "cuda_snapshots_h200", "cuda_oom_h200"])
def test_the_bytes_pytorch_wrote_read_the_same_a_window_at_a_time(folder):
    """Not re-pickled: the recordings' own bytes, as torch.cuda.memory._dump_snapshot wrote
    them, through windows that split nearly every op."""
    import io
    from npumem.trace.snapshot import _reader as native
    paths = sorted((DATA / folder).rglob("*.pickle*"))[:4]
    assert paths
    for path in paths:
        data = _as_recorded(path)
        _same_read(native.load(io.BytesIO(data), 5), native.load(data))


def test_a_failing_file_and_a_bad_window_are_passed_on():
    import io
    from npumem.trace.snapshot import _reader as native

    class Broken(io.RawIOBase):
        def readinto(self, buffer):
            raise OSError("the disk went away")

    with pytest.raises(OSError, match="the disk went away"):
        native.load(Broken())
    with pytest.raises(ValueError, match="window"):
        native.load(io.BytesIO(b"N."), 0)
    with pytest.raises(UnsafePickle, match="truncated"):
        load_pickle(io.BytesIO(pickle.dumps({"device_traces": [[]]})[:-3]), shown)


def test_bounded_reader_reads_plain_and_gzip_files_and_refuses_past_the_limit(tmp_path):
    from npumem.trace.file_checks import TraceFormatError
    from npumem.trace.textio import bounded_reader
    data = pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1,
                                                             "size": 2}]]})
    plain, packed, broken = tmp_path / "a.pickle", tmp_path / "b.pickle.gz", tmp_path / "c.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    broken.write_bytes(gzip.compress(data)[:-12])
    for path in (plain, packed):
        with bounded_reader(str(path), len(data)) as reader:
            _, devices, _ = load_pickle(reader, shown)
        assert list(devices[0]) == [{"action": "alloc", "addr": 1, "size": 2}]
        with pytest.raises(TraceFormatError, match=f"more than {len(data) - 1} bytes"):
            with bounded_reader(str(path), len(data) - 1) as reader:
                load_pickle(reader, shown)
    with pytest.raises(TraceFormatError, match="truncated or corrupt"):
        with bounded_reader(str(broken), 1 << 20) as reader:
            load_pickle(reader, shown)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(1, 400), st.data())
def test_order_by_key_is_a_stable_argsort(values, distinct, data):
    """Keys with few distinct values (the one-pass order), and with many (None: a sort); all
    of them, or some rows of them in either width."""
    import numpy as np
    from npumem.trace.snapshot import _reader as native
    from npumem.trace.snapshot.columns import stable_order
    keys = np.array([v % distinct * (2**64 // distinct) for v in values], dtype=np.uint64)
    expected = np.argsort(keys, kind="stable").tolist()
    order = native.order_by_key(keys)
    if order is not None:
        assert np.frombuffer(order, dtype=np.int64).tolist() == expected
    elif len(keys):
        assert len(np.unique(keys)) > len(keys) // 4
    chosen = sorted(data.draw(st.sets(st.integers(0, max(0, len(keys) - 1)))) if len(keys) else [])
    for dtype in (np.int32, np.int64):
        rows = np.array(chosen, dtype=dtype)
        got = stable_order(keys, rows)
        assert got.dtype == dtype
        assert got.tolist() == rows[np.argsort(keys[rows], kind="stable")].tolist()
    with pytest.raises(IndexError):
        native.order_by_key(keys, np.array([len(keys)], dtype=np.int64), 8)


def test_an_entry_of_many_fields_reads_as_pickle_reads_it():
    """Past 16 fields an entry's keys are found in a dict: same fields, same last values."""
    entry = {"action": "alloc", "addr": 1, "size": 2, **{k: k for k in range(40_000)},
             "tag": "x"}
    data = pickle.dumps({"segments": [], "device_traces": [[entry, dict(entry)]]}, protocol=2)
    _, devices, _ = load_pickle(data, shown)
    assert list(devices[0]) == pickle.loads(data)["device_traces"][0]
    many = (b"(" + _entry(_GOOD, *[_text(f"k{i % 20}") + b"K" + bytes([i]) for i in range(60)])
            + b"e")                                   # 20 keys, each set three times
    assert [list(d) for d in load_pickle(_snapshot(many), shown)[1]] == \
        pickle.loads(_snapshot(many))["device_traces"]


def test_an_entry_caught_in_something_else_is_named_plainly():
    data = _snapshot(b"(" + _entry(_GOOD) + b"\x85e")       # the entry inside a tuple
    with pytest.raises(EntryError) as caught:
        load_pickle(data, shown)
    assert "a trace entry" in str(caught.value) and "capsule" not in str(caught.value)


def test_a_huge_integer_is_refused_before_the_file_is_read_for_it():
    import io
    from npumem.trace.snapshot import _reader as native
    with pytest.raises(UnsafePickle, match="an integer of 2147483647 bytes"):
        native.load(io.BytesIO(b"\x80\x02\x8b\xff\xff\xff\x7f" + b"x" * 100), 16)


def test_the_files_own_error_is_not_taken_for_a_global(tmp_path):
    """A size limit met while a GLOBAL's line is read is the limit, not "it asks for"."""
    from npumem.trace.file_checks import TraceFormatError
    from npumem.trace.snapshot import _reader as native
    from npumem.trace.textio import bounded_reader
    path = tmp_path / "global.pickle.gz"              # (gzip: the limit is met while reading)
    path.write_bytes(gzip.compress(b"\x80\x02cos\nsystem\n" + b"N" * 64 + b"."))
    with bounded_reader(str(path), 10) as reader:
        with pytest.raises(TraceFormatError, match="more than 10 bytes"):
            native.load(reader, 4)


def test_a_column_of_zeros_takes_no_bytes_until_a_value_is_not():
    """One stream and no requested_size (most traces): those columns hold nothing; a stream
    named late writes the zeros before it."""
    from npumem.trace.snapshot import _reader as native
    quiet = [{"action": "alloc", "addr": 512 * i, "size": 512} for i in range(3000)]
    late = [dict(entry) for entry in quiet]
    late[2500]["stream"] = 7
    for trace, stream in ((quiet, None), (late, 7)):
        data = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)
        raw = native.load(data)[1][0][0]
        assert raw["requested"] is None and (raw["stream"] is None) == (stream is None)
        assert raw["action"] is None                    # every action is alloc, code 0
        _, devices, _ = load_pickle(data, shown)
        assert list(devices[0]) == trace
        assert devices[0].columns.stream.tolist() == [e.get("stream", 0) for e in trace]
