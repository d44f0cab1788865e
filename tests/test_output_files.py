"""Commands that write files: the output is checked before the work, never overwrites the input
(same path, symbolic or hard link), and is written whole or not at all."""

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.output_files import OutputPathError, check_output, written_whole

SNAPSHOT = Path(__file__).parent / "data" / "cuda_snapshots" / "mlp.pickle.gz"


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "run.pickle.gz"
    shutil.copy(SNAPSHOT, path)
    return path


def _links(source: Path) -> dict:
    symbolic, hard = source.parent / "symbolic.gz", source.parent / "hard.gz"
    symbolic.symlink_to(source)
    os.link(source, hard)
    return {"same path": source, "symbolic link": symbolic, "hard link": hard}


def test_convert_onto_its_input_is_refused_and_the_input_survives(source):
    before = source.read_bytes()
    for kind, target in _links(source).items():
        result = CliRunner().invoke(main, ["convert", str(source), str(target), "--to", "jsonl"])
        assert result.exit_code == 2, kind
        assert "would destroy the input" in result.output and "Traceback" not in result.output
    assert source.read_bytes() == before


def test_report_html_onto_its_input_is_refused(source):
    result = CliRunner().invoke(main, ["report", str(source), "--html", str(source)])
    assert result.exit_code == 2 and "would destroy the input" in result.output
    assert source.read_bytes() == SNAPSHOT.read_bytes()


def test_outputs_are_checked_before_the_work(tmp_path, source):
    missing = tmp_path / "no" / "such" / "folder"
    for args in (["convert", str(source), str(missing / "x.jsonl")],
                 ["plan", str(source), "--out", str(missing / "plan.csv"), "--time-limit", "60"],
                 ["replay", str(source), "--plot", str(missing / "plot.svg")],
                 ["report", str(source), "--html", str(missing / "r.html")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, args
        assert "does not exist" in result.output and "Traceback" not in result.output, args


def test_a_failed_write_leaves_no_partial_file_and_keeps_the_old_one(tmp_path, source, monkeypatch):
    from npumem.trace.snapshot import json_form as jsonl

    target = tmp_path / "out.jsonl"
    target.write_text("the previous output\n")
    real = jsonl.write_snapshot

    def fails_half_way(data, path):
        Path(path).write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonl, "write_snapshot", fails_half_way)
    result = CliRunner().invoke(main, ["convert", str(source), str(target)])
    assert result.exit_code == 2 and "No space left on device" in result.output
    assert target.read_text() == "the previous output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "run.pickle.gz"]
    monkeypatch.setattr(jsonl, "write_snapshot", real)
    assert CliRunner().invoke(main, ["convert", str(source), str(target)]).exit_code == 0
    assert target.read_text().count("\n") > 100


def test_check_output_and_written_whole_directly(tmp_path):
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output(str(tmp_path))
    check_output(str(tmp_path / "new.csv"))                    # a new file in a writable folder
    target = tmp_path / "data.csv.gz"
    with written_whole(str(target)) as partial:
        assert partial.endswith("data.csv.gz") and partial != str(target)   # suffix kept
        Path(partial).write_text("x")
    assert target.read_text() == "x" and len(list(tmp_path.iterdir())) == 1
