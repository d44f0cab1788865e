"""Runs that died on a real GPU (tests/data/cuda_oom_h200: an NVIDIA H200, PyTorch 2.11.0+cu130).

bench/oom_gpu.py ran seven workloads under caps set with set_per_process_memory_fraction, each
cap under every setting tune considers, each run in a fresh process, and kept the snapshot the
OOM observer dumped where a run died (README.md there). Here:

- the rule those runs showed: a memory fraction counts the segment a request asks for, and
  expandable segments then map whole pages past it;
- the model replays each kept OOM snapshot under the settings it ran with exactly (`replay
  --check` MATCHes) and runs out of memory at the entry the GPU first did;
- tune, on the default setting's snapshots as `npumem tune SNAPSHOT` reads them (the cap the
  observer kept), gives each setting the verdict the GPU gave it, but for the runs named below,
  and recommends no setting that ran out of memory on the GPU.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from npumem.alloc.torch_model import (DeviceMemory, ModelOutOfMemory, TorchAllocatorModel,
                                      parse_config)
from npumem.trace.snapshot import first_oom
from npumem.whatif.torch_replay import load_for_model, replay_recording
from npumem.whatif.torch_tune import tune_recording

DATA = Path(__file__).parent / "data" / "cuda_oom_h200"
MiB = 1 << 20

# Where tune's verdict and the GPU differ, and why. Each is a run the GPU took past the end of
# the default setting's recording: the requests up to the failed one are the recording's, the
# model serves them as the GPU did, and what the run asked for afterwards is not recorded.
DISAGREE = {
    # get past the failed request of a first-step death (as on the GPU: reserved passes the
    # fraction by part of a 20 MiB page) and die 10 requests later; tune names them only to try
    ("cnn_sgd", 153, "expandable_segments:True"): "died after the recording's end",
    ("cnn_sgd", 153, "expandable_segments:True,roundup_power2_divisions:4"):
        "died after the recording's end",
    ("cnn_sgd", 158, "expandable_segments:True"): "died after the recording's end",
    ("cnn_sgd", 158, "expandable_segments:True,roundup_power2_divisions:4"):
        "died after the recording's end",
    ("cnn_sgd", 158, "roundup_power2_divisions:4"): "died after the recording's end",
    ("cnn_sgd", 158, "max_split_size_mb:128,roundup_power2_divisions:4"):
        "died after the recording's end",
    ("encoder", 194, "expandable_segments:True"): "died after the recording's end",
    ("encoder", 194, "expandable_segments:True,roundup_power2_divisions:4"):
        "died after the recording's end",
    # the recording went on after OOMs cuDNN caught (it then asks for another workspace): under
    # expandable segments the GPU asked for other things from there on
    ("cnn_wide", 247, "expandable_segments:True"): "requests differ after a caught OOM",
    # fit the played-on run, die later in the real one
    ("gpt_generate", 70, "roundup_power2_divisions:4"): "died after the played-on run",
    ("gpt_generate", 70, "max_split_size_mb:128,roundup_power2_divisions:4"):
        "died after the played-on run",
    # a forward pass's layers, played on for one more: the step grows further (the two
    # recommendations that failed before tune named such a setting only to try)
    ("gpt_train", 183, "expandable_segments:True"): "died after the played-on layer",
    ("gpt_train", 183, "expandable_segments:True,roundup_power2_divisions:4"):
        "died after the played-on layer",
    ("mlp", 126, "expandable_segments:True"): "died after the played-on layer",
    # the played-on layer at the largest size each request had: more than the run asked
    ("mlp", 129, "expandable_segments:True,roundup_power2_divisions:4"):
        "the played-on layer is larger than the real one",
}


def _rows() -> list[dict]:
    with gzip.open(DATA / "results.jsonl.gz", "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _kept(row: dict) -> Path | None:
    path = DATA / row["snapshot"] if row.get("snapshot") else None
    return path if path is not None and path.exists() else None


def test_the_recordings_are_what_the_readme_says():
    rows = _rows()
    capped = [r for r in rows if r["kind"] == "capped"]
    assert len(rows) == 371 and len(capped) == 364
    assert sum(1 for r in rows if r["finished"]) == 70
    assert {r["gpu"] for r in rows} == {"NVIDIA H200"}
    assert {r["torch"] for r in rows} == {"2.11.0+cu130"}
    died = [r for r in capped if r["finished"] is False]
    kept = [r for r in died if _kept(r)]
    assert len(died) == 301 and len(kept) == 198
    assert sum(1 for r in kept if r["setting"] == "") == 24      # every default that died


def test_a_fraction_counts_the_segment_asked_for_not_the_pages_mapped():
    """c10's alloc_block checks reserved + get_allocation_size against allowed_memory_maximum;
    an expandable segment then maps whole 20 MiB pages unchecked (cnn_wide reserved 250 MiB
    under a 247 MiB cap on the H200). A device of that size has no room for the page."""
    expandable = parse_config("expandable_segments:True")
    model = TorchAllocatorModel(expandable, DeviceMemory(None), allowed=35 * MiB)
    model.malloc(12 * MiB)                    # maps one 20 MiB page
    model.malloc(12 * MiB)                    # 20 + 12 <= 35: maps a second one
    assert model.stats.reserved == 40 * MiB
    device = TorchAllocatorModel(expandable, DeviceMemory(35 * MiB))
    device.malloc(12 * MiB)
    with pytest.raises(ModelOutOfMemory):
        device.malloc(12 * MiB)


def test_the_model_replays_every_real_oom_snapshot_exactly():
    """MATCH under the settings each run had, the fraction's limit as the observer kept it:
    c10 checks it on the segment a request asks for (expandable segments then map whole pages,
    past the limit), and garbage collection under it frees what the GPU freed."""
    checked, missed = 0, []
    for row in _rows():
        path = _kept(row)
        if row["kind"] != "capped" or row["finished"] is not False or path is None:
            continue
        recording = load_for_model(str(path))
        result = replay_recording(recording, recording.base_config(), check=True)
        checked += 1
        first = first_oom(recording.entries)
        if not (result.faithful and result.oom is not None and result.oom["index"] == first):
            missed.append((row["workload"], row["cap_bytes"] // MiB, row["setting"],
                           result.divergence.describe() if result.divergence else result.oom))
    assert checked == 198
    assert missed == []


def test_tune_on_the_real_oom_snapshots_against_the_gpu():
    groups: dict = {}
    for row in _rows():
        if row["kind"] == "capped":
            groups.setdefault((row["workload"], row["cap_bytes"] // MiB), {})[row["setting"]] = row
    agree = total = right = recommended = tries = tried = 0
    disagree = {}
    for (workload, cap), runs in sorted(groups.items()):
        default = runs[""]
        if default["finished"] is not False:
            continue                              # no OOM to tune
        recording = load_for_model(str(_kept(default)))
        tuning = tune_recording(recording, workers=1)
        base = recording.base_config()
        gpu = {(parse_config(s, base=base) if s else base).describe(): r["finished"]
               for s, r in runs.items()}
        for candidate in tuning.candidates:
            truth = gpu[candidate.config.describe()]
            total += 1
            agree += candidate.finishes == truth
            if candidate.finishes != truth:
                disagree[(workload, cap, candidate.config.describe())] = candidate.finishes
        if tuning.best is not None:
            recommended += 1
            assert gpu[tuning.best.config.describe()], (workload, cap, tuning.best.line)
        if tuning.worth_trying is not None:
            tries += 1
            tried += gpu[tuning.worth_trying.config.describe()]
        elif tuning.best is None and not any(gpu.values()):
            right += 1                            # none fits, and none finished on the GPU
    assert set(disagree) == set(DISAGREE)
    assert (agree, total) == (297, 312)
    # one recommendation (gpt_generate at 70 MiB: expandable segments; it finished on the
    # GPU); "none fits" where no setting finished, 12 times; a setting to try in 10 runs that
    # died before the recording repeated a whole step, which finished in 5
    assert recommended == 1 and right == 12
    assert (tries, tried) == (10, 5)


def test_a_setting_only_worth_trying_is_given_no_batch(tmp_path):
    """On the H200 mlp at 126 MiB, expandable segments got past the failed request and then ran
    out of memory: tune names it only to try, and says no batch would fit under it."""
    import json

    from click.testing import CliRunner

    from npumem.cli import main

    result = CliRunner().invoke(main, ["tune", "--json", str(
        DATA / "snapshots" / "mlp" / "126MiB_default.pickle.gz")])
    answer = json.loads(result.output)
    assert answer["recommended"] is None and "expandable_segments:True" in \
        answer["worth_trying_env"]
    assert answer["batch_scale"] is None


def test_tune_from_a_run_with_expandable_segments_tries_them_off_as_the_gpu_ran_them():
    """tune on the snapshots of the runs with expandable segments that died: the settings it
    tries that the GPU also ran (the run's own, with roundup 4, and both without expandable
    segments) get the GPU's verdict, but for one first-step death that tune names only to try;
    nothing that died on the GPU is recommended."""
    groups: dict = {}
    for row in _rows():
        if row["kind"] == "capped":
            groups.setdefault((row["workload"], row["cap_bytes"] // MiB), {})[row["setting"]] = row
    agree = total = tuned = 0
    disagree = set()
    for (workload, cap), runs in sorted(groups.items()):
        run = runs.get("expandable_segments:True")
        if run is None or run["finished"] is not False or _kept(run) is None:
            continue
        tuned += 1
        recording = load_for_model(str(_kept(run)))
        tuning = tune_recording(recording, workers=1)
        defaults = parse_config("", recording.flavour)
        gpu = {(parse_config(s, base=defaults) if s else defaults).describe(): r["finished"]
               for s, r in runs.items()}
        assert tuning.candidates[0].as_recorded
        assert "" in [c.config.describe() for c in tuning.candidates]     # tried without
        for candidate in tuning.candidates:
            described = candidate.config.describe()
            if described in gpu:
                total += 1
                agree += candidate.finishes == gpu[described]
                if candidate.finishes != gpu[described]:
                    disagree.add((workload, cap, described))
        if tuning.best is not None:
            assert gpu[tuning.best.config.describe()], (workload, cap, tuning.best.line)
    assert tuned == 12 and (agree, total) == (47, 48)
    # a first-step death: on the GPU it died after the recording's end; tune names it only to try
    assert disagree == {("cnn_sgd", 158, "roundup_power2_divisions:4")}
