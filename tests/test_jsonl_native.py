"""The JSONL trace's C parser (trace/_jsonl.c) against the Python reader it stands in for: the
same events, or the same error, for any file; read a few bytes at a time as well as whole."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npumem.trace import TraceFormatError, jsonl
from npumem.trace.jsonl import read_entries
from npumem.trace.snapshot.columns import ALLOC, FREE_COMPLETED
from npumem.trace.textio import reading

pytestmark = pytest.mark.skipif(jsonl._jsonl is None, reason="the C parser is not built")


def python_events(path: str):
    """The Python reader, line by line: the oracle."""
    with reading(path) as handle:
        return [jsonl._event(path, number, line)
                for number, line in enumerate(handle, 1) if line.strip()]


def outcome(read, path):
    try:
        return [tuple(event) for event in read(path)]
    except TraceFormatError as exc:
        return ("error", exc.position, exc.reason)


NUMBERS = st.one_of(
    st.integers(0, 2**64 + 5).map(str),
    st.sampled_from(["0", "-0", "01", "-1", "1.0", "1e3", "18446744073709551615",
                     "18446744073709551616", "1" * 40, "true", "null", '"5"', "[1]", "NaN"]))
TIMES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-2**70, 2**70).map(str),
    st.sampled_from(["1e400", "-1e-400", "1E5", "1.5e+20", "0.1", "-0", ".5", "1.", "Infinity",
                     "NaN", "00.5", '"1.0"', "1" * 70]))
ACTIONS = st.sampled_from(['"alloc"', '"free"', '"Alloc"', '"free_requested"', '"\\u0061lloc"',
                           '"alloc "', "null", '"fr\u00e9e"'])
SPACE = st.sampled_from(["", " ", "  ", "\t", " \t "])


@st.composite
def lines(draw) -> str:
    """One line: the common form with its keys in any order and any spacing, or that form
    bent (a key missing, doubled or unknown, a value of another kind, garbage around it)."""
    fields = {"t_us": draw(TIMES), "action": draw(ACTIONS), "addr": draw(NUMBERS),
              "size": draw(NUMBERS), "stream": draw(NUMBERS)}
    keys = draw(st.permutations(list(fields)))
    keys = keys[:draw(st.integers(2, 5))]
    if draw(st.booleans()):
        keys = [key for key in keys if key not in ("t_us", "stream")] + ["action", "addr", "size"]
        keys = list(dict.fromkeys(keys))
    extra = draw(st.sampled_from([None, None, None, ("device", "0"), ("addr", "7"),
                                  ("a\\u0064dr", "7"), ("note", '{"x": [1, 2]}')]))
    items = [(key, fields[key]) for key in keys] + ([extra] if extra else [])
    s = lambda: draw(SPACE)     # noqa: E731
    body = ",".join(f'{s()}"{key}"{s()}:{s()}{value}{s()}' for key, value in items)
    line = f"{s()}{{{body}}}{s()}"
    return draw(st.sampled_from([line, line, line, line, line + "x", line[:-1], "", " \t",
                                 "\x0c", "[]", "\ufeff" + line, line.replace('"', "'", 1)]))


ENDINGS = st.sampled_from(["\n", "\r\n", "\r"])


def write(tmp_path, data: bytes, name: str = "t.jsonl") -> str:
    path = str(tmp_path / name)
    with open(path, "wb") as out:
        out.write(data)
    return path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(lines(), ENDINGS), max_size=8), st.integers(1, 64), st.integers(1, 4),
       st.booleans())
def test_same_events_or_error_as_the_python_reader(tmp_path, content, window, chunk, last_ended):
    text = "".join(line + ending for line, ending in content)
    if content and not last_ended:
        text = text[:-len(content[-1][1])]          # the last line without its ending
    path = write(tmp_path, text.encode("utf-8"))
    expected = outcome(python_events, path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonl, "WINDOW", window)
        patch.setattr(jsonl, "CHUNK", chunk)
        assert outcome(jsonl.read, path) == expected
    if isinstance(expected, list):
        entries = jsonl.read_entries(path)
        assert [(e["time_us"], "alloc" if e["action"] == "alloc" else "free", e["addr"],
                 e["size"], e["stream"]) for e in entries] == expected


def test_the_common_form_never_reaches_the_python_reader(tmp_path, monkeypatch):
    events = [{"t_us": 1.5, "action": "alloc", "addr": 2**64 - 1, "size": 0, "stream": 7},
              {"action": "free", "size": 512, "addr": 4096},
              {"t_us": -0.0, "action": "alloc", "addr": 0, "size": 2**63, "stream": 0}]
    text = "\n".join(json.dumps(e, separators=(sep, ":")) for e, sep in
                     zip(events, (",", ", ", ",\t"))) + "\r\n \t\n"
    path = write(tmp_path, gzip.compress(text.encode()), "t.jsonl.gz")

    def refused(path, number, line):
        raise AssertionError(f"line {number} went to the Python reader: {line!r}")

    monkeypatch.setattr(jsonl, "_event", refused)
    assert [tuple(e) for e in jsonl.read(path)] == [
        (1.5, "alloc", 2**64 - 1, 0, 7), (0.0, "free", 4096, 512, 0), (-0.0, "alloc", 0, 2**63, 0)]
    entries = read_entries(path)
    c = entries.columns
    assert c.action.tolist() == [ALLOC, FREE_COMPLETED, ALLOC]
    assert c.addr.dtype == np.uint64 and c.addr.tolist() == [2**64 - 1, 4096, 0]
    assert c.times().tolist() == [1.5, 0.0, -0.0]


def test_a_line_past_the_window_and_an_error_names_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "WINDOW", 16)
    long = json.dumps({"t_us": 0.25, "action": "alloc", "addr": 10**15, "size": 10**12})
    path = write(tmp_path, (long + "\n\n" + long.replace("alloc", "free") + "\n"
                            + '{"action": "alloc", "addr": 5, "size": 1.5}\n').encode())
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:4: the size must be an integer") as err:
        list(jsonl.read(path))
    assert "1.5" in str(err.value)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    path = write(tmp_path, b'{"action": "alloc", "addr": 1, "size": 2}\n{"action": "fr\xffee"}\n')
    with pytest.raises(TraceFormatError, match=r":2: not UTF-8 text"):
        list(jsonl.read(path))


def test_a_damaged_gzip_is_a_format_error(tmp_path):
    line = b'{"action": "alloc", "addr": 1, "size": 2}\n'
    data = gzip.compress(line * 50_000)
    path = write(tmp_path, data[:len(data) // 2], "t.jsonl.gz")
    with pytest.raises(TraceFormatError, match="truncated or corrupt"):
        read_entries(path)


def test_a_byte_order_mark_before_the_first_line_is_read_past(tmp_path):
    # Windows editors write one; the trace read as "unknown format" before.
    from npumem.trace import read_trace

    text = '{"action": "alloc", "addr": 1, "size": 2}\n{"action": "free", "addr": 1, "size": 2}\n'
    plain = write(tmp_path, text.encode(), "plain.jsonl")
    marked = write(tmp_path, b"\xef\xbb\xbf" + text.encode(), "marked.jsonl")
    assert list(read_trace(marked)) == list(read_trace(plain)) and len(list(read_trace(plain))) == 2
    assert len(read_entries(marked)) == 2
