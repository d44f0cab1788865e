"""msprof's and torch_npu's memory files as an Ascend user has them: operator names as the
allocation sites (report, diff, convert), npu_module_mem.csv and memory_record.csv read with
operator_memory.csv, a profiler output folder reported whole, and the negative and empty values
CANN documents read with notes. The folders in tests/data/msprof are made up in the shapes
torch_npu (ASCEND_PROFILER_OUTPUT, MB) and msprof (mindstudio_profiler_output, KB) write."""

import pathlib
import pickle
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.profile.ascend import find_outputs, sparkline
from npumem.trace import TraceFormatError, detect_format, read_trace
from npumem.trace.msprof import is_module_memory, to_snapshot, usage_curves
from npumem.trace.snapshot import load_data

DATA = pathlib.Path(__file__).parent / "data" / "msprof"
ASCEND_PT = DATA / "worker0_20250101080000000_ascend_pt"
OUTPUT = ASCEND_PT / "ASCEND_PROFILER_OUTPUT"
PROF = DATA / "PROF_000001_20250101080000000_ABCDEFGHIJ"
SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "formats"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/formats not beside the repo")


def _npumem(*args) -> subprocess.CompletedProcess:
    """The command line itself, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "npumem", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def _cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def _section(text: str, heading: str) -> dict[str, str]:
    """{site: size} of one "by site" list of the text report."""
    lines = text.split(heading, 1)[1].splitlines()[1:]
    sites = {}
    for line in lines:
        match = re.match(r"\s+([\d.]+ \w+) in\s+\d+ allocation\(s\)\s+(.+)$", line)
        if not match:
            break
        sites[match.group(2)] = match.group(1)
    return sites


AT_PEAK = {"cann::MatMul": "16.00 MiB", "aten::mul": "8.00 MiB", "aten::empty_strided": "4.00 MiB",
           "aten::zeros": "512.00 KiB", "[allocated before the profiler started]": "256.00 KiB"}


def test_report_on_a_torch_npu_profiler_folder_names_the_operators_at_the_peak():
    result = _npumem("report", ASCEND_PT)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "peak allocated 28.75 MiB" in result.stdout
    # aten::add (2 MiB) was released at +0.400 ms, before MatMul's 16 MiB at +0.450 ms
    assert _section(result.stdout, "live at the allocated peak, by site:") == AT_PEAK
    assert _section(result.stdout, "all allocations, by site:")["aten::mul"] == "9.00 MiB"
    assert "(no Python stack" not in result.stdout


@pytest.mark.parametrize("where", ["output", "parent", "file"])
def test_the_same_report_from_the_output_folder_a_parent_or_the_file(tmp_path, where):
    parent = tmp_path / "runs"
    shutil.copytree(ASCEND_PT, parent / ASCEND_PT.name)
    path = {"output": OUTPUT, "parent": parent,
            "file": parent / ASCEND_PT.name / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv"}[where]
    result = _cli("report", path)
    assert result.exit_code == 0, result.output
    assert _section(result.output, "live at the allocated peak, by site:") == AT_PEAK
    assert "Memory by component" in result.output       # the neighbours are read with it


def _component(text: str, name: str, source: str) -> list[str]:
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == name and cells[-1] == source:
            return cells
    raise AssertionError(f"no {name} row from {source} in:\n{text}")


def test_components_from_memory_record_and_npu_module_mem():
    text = _cli("report", ASCEND_PT).output
    #              component device  peak allocated  peak reserved  at the operators' peak  samples
    assert _component(text, "PTA", "memory_record.csv")[1:6] == [
        "NPU:0", "14.75 MiB", "40.00 MiB", "12.75 MiB", "9"]
    assert _component(text, "GE", "memory_record.csv")[2:5] == ["16.00 MiB", "32.00 MiB", "16.00 MiB"]
    assert _component(text, "PTA+GE", "memory_record.csv")[2:5] == [
        "28.75 MiB", "72.00 MiB", "28.75 MiB"]
    # APP is the process's device memory: torch_npu writes it as reserved only
    assert _component(text, "APP", "memory_record.csv")[2:4] == ["-", "1.30 GiB"]
    assert _component(text, "RUNTIME", "npu_module_mem.csv")[2:4] == ["-", "112.00 MiB"]
    assert _component(text, "GE", "npu_module_mem.csv")[2:4] == ["-", "33.50 MiB"]


def test_the_timeline_shows_when_each_component_peaked():
    text = _cli("report", ASCEND_PT).output
    assert "Timeline over 1.000 ms" in text
    lines = {line.split("|")[0].strip(): line for line in text.splitlines() if line.count("|") == 2}
    assert set(lines) >= {"operators (dev 0)", "PTA+GE NPU:0", "PTA NPU:0", "GE NPU:0",
                          "APP NPU:0", "RUNTIME NPU:0 (module)"}
    assert lines["PTA+GE NPU:0"].endswith("peak 28.75 MiB at +0.450 ms")
    assert lines["operators (dev 0)"].endswith("peak 28.75 MiB at +0.450 ms")
    assert lines["PTA NPU:0"].endswith("peak 14.75 MiB at +0.300 ms")
    assert all(len(line.split("|")[1]) == 48 for line in lines.values())


def test_sparkline_keeps_the_highest_value_of_each_column_and_carries_the_last_on():
    curve = [(10.0, 1.0), (11.0, 8.0), (12.0, 1.0), (30.0, 4.0)]
    # columns of 10 us: nothing yet; the 8 spike; 1 carried on; 4 (half the peak)
    assert sparkline(curve, 0.0, 40.0, 4) == " █▂▅"
    assert sparkline([(0.0, 0.0)], 0.0, 0.0, 3) == "▁▁▁"      # a single instant, nothing to scale


def test_negative_and_empty_values_are_notes_not_tracebacks():
    result = _npumem("report", OUTPUT)
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr
    notes = [line for line in result.stdout.splitlines() if line.startswith("note:")]
    expected = [
        "operator_memory.csv: 2 rows with a negative size: read as releases of memory allocated "
        "before the profiler started",
        "operator_memory.csv: 1 of those with no time at all: left off the timeline",
        "operator_memory.csv: 1 row with no allocation time: placed at the start of the profile",
        "operator_memory.csv: 1 row with no size: skipped",
        "operator_memory.csv: 1 allocation with no release time: still allocated when the "
        "profiler stopped",
        "1 total below zero (npu_module_mem writes -1 where only releases were collected): read "
        "as unknown"]
    for sentence in expected:
        assert sum(sentence in note for note in notes) == 1, (sentence, notes)


def test_a_release_with_a_time_holds_memory_from_the_start_and_an_untimed_one_is_left_out():
    data, _ = to_snapshot(str(OUTPUT / "operator_memory.csv"))
    entries = data["device_traces"][0]
    before = [e for e in entries if e.get("user_metadata") == "allocated before the profiler started"]
    # the -256 KB release at +0.700 ms is there; the untimed -512 KB one is not
    assert [(e["action"], e["size"], e["time_us"]) for e in before] == [
        ("alloc", 256 * 1024, entries[0]["time_us"])]
    freed = [e for e in entries if e["addr"] == before[0]["addr"] and e["action"] != "alloc"]
    assert [e["time_us"] - entries[0]["time_us"] for e in freed] == [600.0, 600.0]
    # replays read it alike: the timed release's block is live from the start, the untimed
    # one is left out
    events = list(read_trace(OUTPUT / "operator_memory.csv"))
    assert (events[0].action, events[0].size) == ("alloc", 256 * 1024)
    assert len(events) == len([e for e in entries if e["action"] != "free_requested"])


def test_msprof_own_output_folder_in_kilobytes():
    assert [pathlib.Path(f.folder).name for f in find_outputs(str(DATA))] == [
        "mindstudio_profiler_output", "ASCEND_PROFILER_OUTPUT"]
    text = _cli("report", PROF).output
    assert _section(text, "live at the allocated peak, by site:") == {
        "MatMul": "2.00 MiB", "Conv2D": "1.00 MiB"}
    assert _component(text, "GE", "memory_record_20250101080001.csv")[2:4] == ["3.00 MiB", "4.00 MiB"]
    assert _component(text, "RUNTIME", "npu_module_mem_20250101080001.csv")[3] == "96.00 MiB"
    both = _cli("report", DATA)
    assert both.exit_code == 0 and both.output.count("(Ascend profiler memory)\n") == 2


@pytest.mark.parametrize("suffix", ["jsonl", "pickle"])
def test_convert_carries_the_operator_as_a_frame(tmp_path, suffix):
    target = tmp_path / f"ops.{suffix}"
    result = _npumem("convert", OUTPUT / "operator_memory.csv", target)
    assert result.returncode == 0, result.stderr
    assert "1 row with no size: skipped" in result.stdout
    data = load_data(str(target))
    allocs = [e for e in data["device_traces"][0] if e["action"] == "alloc"]
    assert {"name": "cann::MatMul", "filename": "<operator>", "line": 0} in [
        frame for e in allocs for frame in e["frames"]]
    if suffix == "pickle":
        assert pickle.loads(target.read_bytes())["device_traces"][0][1]["frames"]
    report = _cli("report", target)
    assert report.exit_code == 0, report.output
    assert _section(report.output, "live at the allocated peak, by site:") == AT_PEAK


def test_convert_to_formats_without_frames_still_notes_the_odd_rows(tmp_path):
    result = _cli("convert", OUTPUT / "operator_memory.csv", tmp_path / "t.csv")
    assert result.exit_code == 0, result.output
    assert "2 rows with a negative size" in result.output


def _operator_file(path, rows):
    header = ("Name,Size(KB),Allocation Time(us),Release Time(us),Active Release Time(us),"
              "Duration(us),Active Duration(us),Stream Ptr,Device Type")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\r\n".join([header] + [",".join(row) for row in rows]) + "\r\n")
    return path


def test_diff_of_two_operator_files_groups_by_operator(tmp_path):
    live = lambda name, kb, t: [name, kb, f"{t}.000\t", "", "", "", "", "1", "NPU:0"]  # noqa: E731
    before = _operator_file(tmp_path / "a" / "operator_memory.csv", [
        live("aten::mul", "1024.0", 100), live("aten::add", "512.0", 110)])
    after = _operator_file(tmp_path / "b" / "operator_memory.csv", [
        live("aten::mul", "1024.0", 100), live("aten::mul", "2048.0", 120),
        live("cann::MatMul", "2048.0", 130)])
    for a, b in ((before, after), (before.parent, after.parent)):     # files, then folders
        result = _cli("diff", a, b)
        assert result.exit_code == 0, result.output
        assert re.search(r"\+2\.00 MiB\s+aten::mul", result.output)
        assert re.search(r"\+2\.00 MiB\s+cann::MatMul", result.output)
        assert re.search(r"-512\.00 KiB\s+aten::add", result.output)


def test_html_report_of_the_folder(tmp_path):
    page = tmp_path / "ascend.html"
    result = _cli("report", ASCEND_PT, "--html", page)
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert "<code>cann::MatMul</code>" in html and "<h2>Memory by component</h2>" in html
    for heading in ("PTA+GE on NPU:0", "APP on NPU:0", "RUNTIME (npu_module_mem) on NPU:0"):
        assert re.search(rf"<h2>{re.escape(heading)}</h2>\s*<svg", html), heading


def test_npu_module_mem_alone_is_summarized_and_refused_by_convert(tmp_path):
    path = OUTPUT / "npu_module_mem.csv"
    report = _cli("report", path)
    assert report.exit_code == 0 and "RUNTIME on NPU:0: 2 sample(s), over 0.500 ms; peak " \
        "reserved 112.00 MiB" in report.output
    converted = _cli("convert", path, tmp_path / "x.jsonl")
    assert converted.exit_code == 2 and "nothing to replay, convert, diff or view" in converted.output
    older = tmp_path / "npu_module_mem.csv"     # torch_npu before mid-2025: no Device_id column
    older.write_text("Component,Timestamp(us),Total Reserved(MB),Device\nHCCL,5.0,64.0,NPU:1\n")
    assert is_module_memory(older.read_bytes())
    assert usage_curves(str(older)) == {("HCCL", "NPU:1"): [(5.0, None, 64.0, None)]}


@pytest.mark.parametrize("name, text, message", [
    ("operator_memory.csv", "Name,Size(KB),Allocation Time(us)\naten::mul,abc,1.0\n",
     "operator_memory.csv:2: Size(KB) must be a number"),
    ("operator_memory.csv", "hello\n", "unknown trace format"),
    ("memory_record.csv", "Component,Timestamp(us),Total Allocated(MB)\nPTA,soon,1.0\n",
     "memory_record.csv:2: Timestamp(us) and the totals must be numbers"),
])
def test_files_that_are_not_the_format_are_one_line_errors(tmp_path, name, text, message):
    path = tmp_path / "ASCEND_PROFILER_OUTPUT" / name
    path.parent.mkdir()
    path.write_text(text)
    for target in (path, tmp_path):
        result = _cli("report", target)
        assert result.exit_code == 2 and "Traceback" not in result.output
        error = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and (message in error[0] or "not an operator_memory.csv" in error[0]), \
            result.output


def test_a_folder_without_profiler_files_says_what_it_looked_for(tmp_path):
    result = _cli("report", tmp_path)
    assert result.exit_code == 2 and "ASCEND_PROFILER_OUTPUT" in result.output


def test_a_file_of_releases_only_reports_without_a_traceback(tmp_path):
    path = _operator_file(tmp_path / "operator_memory.csv", [
        ["cann::", "-128.0", "", "", "", "", "", "", "NPU:0"], ["aten::view", "", "", "", "", "", "",
                                                               "", "NPU:0"]])
    result = _cli("report", path)
    assert result.exit_code == 0, result.output
    assert "1 row with a negative size" in result.output and "1 row with no size: skipped" in result.output


@needs_shared
def test_the_real_shaped_files():
    torch_npu = _cli("report", SHARED / "operator_memory.csv")
    assert torch_npu.exit_code == 0, torch_npu.output
    assert "peak allocated 2.25 MiB" in torch_npu.output
    assert _section(torch_npu.output, "live at the allocated peak, by site:") == {
        "cann::MatMul": "2.00 MiB", "aten::add": "256.00 KiB"}
    assert "1 allocation with no release time but an active release time: read as released " \
        "then" in torch_npu.output
    assert _component(torch_npu.output, "PTA+GE", "memory_record.csv")[2:4] == ["2.00 MiB", "24.00 MiB"]
    msprof = _cli("report", SHARED / "operator_memory_0.csv")
    assert msprof.exit_code == 0 and "1 row with a negative size" in msprof.output
    assert _section(msprof.output, "all allocations, by site:") == {"MatMul": "2.00 MiB",
                                                                     "Add": "64.00 KiB"}
    assert detect_format(SHARED / "operator_memory_0.csv") == "msprof"
    with pytest.raises(TraceFormatError, match="usage curve"):
        detect_format(SHARED / "memory_record.csv")


def test_only_the_profilers_folder_names_are_searched_below_a_parent(tmp_path):
    shutil.copytree(OUTPUT, tmp_path / "npumem-profile")     # msprof-named CSVs, another folder
    assert _cli("report", tmp_path).exit_code == 2
    shutil.copytree(OUTPUT, tmp_path / "rank1_ascend_pt" / "ASCEND_PROFILER_OUTPUT")
    result = _cli("report", tmp_path)
    assert result.exit_code == 0 and result.output.count("(Ascend profiler memory)\n") == 1
    assert "rank1_ascend_pt" in result.output
