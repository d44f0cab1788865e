"""Files other tools write, in the shapes their documentation gives: msprof's and torch_npu's
operator_memory CSVs with the rows CANN allows, msprof's memory_record.csv usage curve, and
RMM logs (old five-column, headerless, failures, midnight, Python log names). Small copies are
written here; the samples in ../shared/data/formats are read too where they exist."""

import json
import pathlib

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.trace import TraceEvent, read_trace, write_trace

FORMATS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "formats"

TORCH_NPU = (
    "Name,Size(KB),Allocation Time(us),Release Time(us),Duration(us),Stream Ptr,Device Type\r\n"
    "aten::empty,512.0,1000.5\t,1040.5\t,40.0\t,187650998437888,NPU:0\r\n"
    "aten::mul,1024.0,1001.0\t,,,187650998437888,NPU:0\r\n"
    "cann::,-128.0,,,,,NPU:0\r\n"
    "cann::Weights,64.0,,,,,NPU:0\r\n")
MSPROF = ("Device_id,Name,Size(KB),Allocation Time(us),Duration(us),Device\r\n"
          "0,MatMul,2048.0,5000.000,30.000,NPU:0\r\n"
          "0,,-128.0,,,NPU:0\r\n"
          "0,Add,64.0,5100.000,,NPU:0\r\n")
USAGE = ("Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),"
         "Stream Ptr,Device Type\r\n"
         "PTA,1000.0\t,1.5,20.0,1.5,1,NPU:0\r\nPTA,1500.0\t,3.0,20.0,3.0,1,NPU:0\r\n"
         "GE,1000.0\t,0.5,4.0,,,NPU:0\r\n")


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_torch_npu_operator_memory_with_the_rows_cann_allows(tmp_path):
    events = list(read_trace(_write(tmp_path, "operator_memory.csv", TORCH_NPU)))
    assert [(e.t_us, e.action, e.size) for e in events] == [
        (1000.5, "alloc", 64 * 1024),        # no allocation time: placed at the start
        (1000.5, "alloc", 512 * 1024), (1001.0, "alloc", 1024 * 1024),
        (1040.5, "free", 512 * 1024)]        # (the release with no time at all is left out)
    replayed = CliRunner().invoke(main, ["replay", str(tmp_path / "operator_memory.csv"),
                                         "--allocator", "pool", "--json"])
    assert replayed.exit_code == 0 and json.loads(replayed.output)[0]["unmatched_frees"] == 0


def test_msprof_own_operator_memory_layout(tmp_path):
    events = list(read_trace(_write(tmp_path, "operator_memory_0.csv", MSPROF)))
    assert [(e.t_us, e.action, e.size) for e in events] == [   # (the untimed release: out)
        (5000.0, "alloc", 2048 * 1024), (5030.0, "free", 2048 * 1024),
        (5100.0, "alloc", 64 * 1024)]                               # Add: still allocated


def test_memory_record_is_summarized_and_never_replayed(tmp_path):
    path = _write(tmp_path, "memory_record.csv", USAGE)
    report = CliRunner().invoke(main, ["report", path])
    assert report.exit_code == 0, report.output
    assert ("PTA on NPU:0: 2 sample(s), over 0.500 ms; peak allocated 3.00 MiB, peak reserved "
            "20.00 MiB") in report.output
    replay = CliRunner().invoke(main, ["replay", path])
    assert replay.exit_code == 2 and "usage curve" in replay.output and "Traceback" not in replay.output
    page = tmp_path / "usage.html"
    drawn = CliRunner().invoke(main, ["report", path, "--html", str(page)])
    assert drawn.exit_code == 0, drawn.output
    html = page.read_text()
    assert "<h2>PTA on NPU:0</h2><svg class=timeline" in html.replace("\n", "")   # two samples
    assert "<h2>GE on NPU:0</h2>\n<p class=sub>Not enough events" in html


@pytest.mark.parametrize("name, text, expected", [
    ("old.csv", "Time,Action,Pointer,Size,Stream\n22:37:25:738700,allocate,0x7f68a2000000,1048576,0\n"
     "22:37:25:738725,free,0x7f68a2000000,1048576,0\n", [(0.0, "alloc"), (25.0, "free")]),
    ("noheader.csv", "1979932,14:21:19.998533,allocate,0x30a000000,256,0x2\n"
     "1980043,14:21:32.661875,free,0x30a000000,256,0x2\n", [(0.0, "alloc"), (12663342.0, "free")]),
    ("midnight.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
     "1,23:59:59.900000,allocate,0x1000,1048576,0x0\n1,23:59:59.950000,allocate failure,,85899345920,0x0\n"
     "1,00:00:00.200000,free,0x1000,1048576,0x0\n", [(0.0, "alloc"), (300000.0, "free")]),
    ("memory_log.csv.dev0", "Thread,Time,Action,Pointer,Size,Stream\n"
     "7,15:47:02.841961,allocate,0x100,64,0\n7,15:47:02.841977,free,0x100,64,0\n",
     [(0.0, "alloc"), (16.0, "free")]),
])
def test_rmm_logs_in_every_shape(tmp_path, name, text, expected):
    events = list(read_trace(_write(tmp_path, name, text)))
    assert [(e.t_us, e.action) for e in events] == expected


def test_rmm_output_writes_times_of_day_and_takes_the_python_log_name(tmp_path):
    epoch_us = 1_712_825_443_018_549.0           # 08:50:43.018549 UTC on a day in 2024
    events = [TraceEvent(epoch_us, "alloc", 0x10, 256), TraceEvent(epoch_us + 86_400e6, "free", 0x10, 256)]
    path = tmp_path / "memory_log.csv.dev0"
    assert write_trace(events, str(path)) == 2          # the name says RMM
    lines = path.read_text().splitlines()
    assert lines[1].split(",")[1] == "08:50:43.018549" and lines[2].split(",")[1] == "08:50:43.018549"
    back = list(read_trace(str(path)))
    assert back[1].t_us - back[0].t_us == 0.0           # a whole day apart reads as the same time
    short = [TraceEvent(0.0, "alloc", 1, 8), TraceEvent(1.5e6, "free", 1, 8)]
    write_trace(short, str(path))
    assert [e.t_us for e in read_trace(str(path))] == [0.0, 1.5e6]


@pytest.mark.skipif(not FORMATS.is_dir(), reason="../shared/data/formats not beside the repo")
def test_the_shared_samples_read_without_a_traceback():
    for path in sorted(FORMATS.glob("*")):
        if path.suffix == ".md":
            continue
        command = ["report", str(path)] if path.name == "memory_record.csv" else \
            ["replay", str(path), "--allocator", "pool"]
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0, (path.name, result.output)


def test_report_and_diff_take_any_trace(tmp_path):
    early = [TraceEvent(0.0, "alloc", 1, 4096), TraceEvent(1.0, "alloc", 2, 1 << 20),
             TraceEvent(2.0, "free", 2, 1 << 20)]
    late = early + [TraceEvent(3.0, "alloc", 3, 3 << 20)]
    write_trace(early, str(tmp_path / "early.jsonl"))
    write_trace(late, str(tmp_path / "late.json"), "chrome")
    report = CliRunner().invoke(main, ["report", str(tmp_path / "late.json")])
    assert report.exit_code == 0, report.output
    assert "peak allocated 3.00 MiB" in report.output and "no segment data" in report.output
    diff = CliRunner().invoke(main, ["diff", str(tmp_path / "early.jsonl"), str(tmp_path / "late.json")])
    assert diff.exit_code == 0 and "+3.00 MiB" in diff.output, diff.output
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n")
    bad = CliRunner().invoke(main, ["report", str(junk)])
    assert bad.exit_code == 2 and "unknown trace format" in bad.output and "Traceback" not in bad.output
