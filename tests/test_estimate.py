"""npumem estimate: the stand-in device, the rules against PyTorch's source arithmetic, the
torch.cuda API a script sees, and the shipped GPU recordings within tolerance."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from npumem.estimate import kernel_rules  # noqa: E402
from npumem.estimate.targets import TARGETS, target  # noqa: E402

from .interrupting import interrupt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRUTH = os.path.join(HERE, "data", "estimate_truth.jsonl")
needs_build = pytest.mark.skipif(shutil.which("g++") is None,
                                 reason="estimate builds its stand-in device with g++")
MiB = 1 << 20


def test_cublas_workspace_follows_the_source():
    h100, a100 = target("h100"), target("a100-80")
    assert kernel_rules.cublas_workspace_size(h100, {}) == 4096 * 8 * 1024          # sm_90
    assert kernel_rules.cublas_workspace_size(a100, {}) == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert kernel_rules.cublas_workspace_size(h100, {"CUBLAS_WORKSPACE_CONFIG": ":4096:8:16:8"}) == \
        4096 * 1024 * 8 + 16 * 1024 * 8
    assert kernel_rules.cublas_workspace_size(h100, {"CUBLAS_WORKSPACE_CONFIG": "junk"}) == 32 * MiB
    assert kernel_rules.cublaslt_workspace_size({}) == MiB
    assert kernel_rules.cublaslt_workspace_size({"CUBLASLT_WORKSPACE_SIZE": "2048"}) == 2 * MiB


def test_attention_workspaces_follow_the_measured_shapes():
    # cuDNN backward: B*H*L*D*4 + B*H*L*4 + 256 (gpt2_amp on the H200: 12,779,776 bytes)
    query = torch.empty(8, 12, 512, 64, device="meta", dtype=torch.float16)
    assert kernel_rules._cudnn_attention_backward([None, query]) == \
        [(12_779_776, "cuDNN attention backward workspace", True)]
    # efficient backward on gpt_train's shapes: delta twice and a 1,049,600-byte workspace
    query = torch.empty(8, 4, 96, 64, device="meta")
    grad = torch.empty(8, 96, 4, 64, device="meta").transpose(1, 2)
    sizes = [size for size, _, _ in kernel_rules._efficient_attention_backward([grad, query])]
    assert sizes == [786_432, 12_288, 12_288, 1_049_600]


def test_targets_and_unknown_names():
    assert target(None).key == "h100" and target(None, "npu").soc.startswith("Ascend910B")
    assert all(t.capacity < t.total_memory for t in TARGETS.values())
    with pytest.raises(KeyError, match="known"):
        target("v100")


def _estimate(tmp_path, source: str, *options: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, NPUMEM_CACHE_DIR=str(tmp_path.parent / "npumem-cache"))
    return subprocess.run([sys.executable, "-m", "npumem", "estimate", *options, "--", str(script)],
                          capture_output=True, text=True, env=env, timeout=300)


@needs_build
def test_a_script_using_torch_cuda_runs_unchanged(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        props = torch.cuda.get_device_properties(0)
        print("NAME", props.name, props.multi_processor_count)
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for step in range(3):
            x = torch.randn(64, 512, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        step_count = opt.state[next(model.parameters())]["step"].item()
        print("STEP", step_count, "LOSS", loss.item())
        print("ALLOCATED", torch.cuda.memory_allocated(), torch.cuda.max_memory_reserved())
        torch.cuda.empty_cache()
        print("AFTER", torch.cuda.memory_reserved())
        """, "--gpu", "a100-40", "--json")
    assert done.returncode == 0, done.stderr
    # with --json the script's own output goes to stderr: stdout is the JSON alone
    lines = dict(line.split(" ", 1) for line in done.stderr.splitlines() if line[:4].isupper()
                 and " " in line)
    assert lines["NAME"] == "NVIDIA A100-SXM4-40GB 108"
    assert lines["STEP"].startswith("3.0")            # AdamW stepped: GradScaler saw no inf
    allocated, reserved = (int(v) for v in lines["ALLOCATED"].split())
    # parameters and AdamW's two states (gradients set to None), cuBLAS workspaces (8.1 MiB on sm_80)
    # of the main thread and of autograd's
    params = (512 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert allocated >= 3 * params + 2 * kernel_rules.cublas_workspace_size(target("a100-40"), {})
    assert reserved >= allocated
    report = json.loads(done.stdout)
    assert report["fits"] and report["target"] == "NVIDIA A100-SXM4-40GB"
    assert report["peak_reserved_bytes"] >= reserved
    assert report["fake_run"]["ops"] > 100


@needs_build
def test_each_device_answers_for_its_own_memory(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        a = torch.empty(2**20, dtype=torch.uint8, device="cuda:0")
        b = torch.empty(3 * 2**20, dtype=torch.uint8, device="cuda:1")
        print("PER", torch.cuda.memory_allocated(0), torch.cuda.memory_allocated("cuda:1"))
        with torch.cuda.device(1):                  # libraries switch devices so
            print("CURRENT", torch.cuda.current_device(), torch.cuda.memory_allocated())
        print("BACK", torch.cuda.current_device())
        state = torch.cuda.get_rng_state()
        torch.cuda.set_rng_state(state)
        """, "--devices", "2")
    assert done.returncode == 0, done.stderr
    assert f"PER {2**20} {3 * 2**20}" in done.stdout
    assert f"CURRENT 1 {3 * 2**20}" in done.stdout and "BACK 0" in done.stdout


@needs_build
def test_sigterm_stops_a_spinning_run_and_leaves_nothing_behind(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text("import torch\nx = torch.randn(100000, device='cuda')\n"
                      "print('spinning', flush=True)\n"
                      "while x.abs().max().item() < 1.0:     # an assumed 0.0: never ends\n"
                      "    x = x * 2\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, NPUMEM_CACHE_DIR=str(tmp_path.parent / "npumem-cache"),
               TMPDIR=str(scratch))
    run = subprocess.Popen([sys.executable, "-m", "npumem", "estimate", "--", str(script)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    code, stderr, _ = interrupt(run, "spinning", signal.SIGTERM)   # as `timeout` sends
    assert code == 130 and "interrupted" in stderr and "Traceback" not in stderr
    assert not list(scratch.glob("npumem-estimate-*"))   # the fake run's folder went with it


@needs_build
def test_a_failing_script_names_its_line_without_a_traceback(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        x = torch.randn(4, device="cuda")
        y = x.numpy()
        """)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "script.py:4" in done.stderr and "NPUMEM_ESTIMATE" in done.stderr


@needs_build
def test_the_npu_estimate_pads_requests(tmp_path):
    source = """
        import torch
        tensors = [torch.empty(1000, dtype=torch.uint8, device="cuda") for _ in range(100)]
        print("ALLOCATED", torch.cuda.memory_allocated())
        """
    cuda = _estimate(tmp_path, source, "--json")
    npu = _estimate(tmp_path, source, "--device", "npu", "--json")
    assert json.loads(npu.stdout)["target"].startswith("Ascend910B")
    # 1000 B is one 1024-B block on cuda (512-B rounding); torch_npu adds 32 B first
    # (AddPadSize): 1032 B, rounded to 1536
    assert "ALLOCATED 102400" in cuda.stderr and "ALLOCATED 153600" in npu.stderr


def test_bad_arguments_are_usage_errors(tmp_path):
    from click.testing import CliRunner

    from npumem.cli import main
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    runner = CliRunner()
    for args, message in ((["--gpu", "v100", str(script)], "unknown --gpu"),
                          (["--set", "expandable_segments:maybe", str(script)], "--set"),
                          (["--assume", "int=x", str(script)], "int takes an integer"),
                          (["--memory", "0", str(script)], "--memory"),
                          ([str(tmp_path / "missing.py")], "no such script"),
                          ([os.path.join(HERE, "data", "cuda_snapshots", "mlp.pickle.gz")],
                           "a recording (a pickle), not a script"),
                          ([os.path.join(HERE, "data", "cpu_recordings")], "is a folder"),
                          (["--bogus", str(script)], "No such option"),
                          ([os.path.join(HERE, "data", "cpu_recordings", "cnn_accum.jsonl.gz")],
                           "not a script"),
                          (["--fit", "B=1,2", str(script)], "no {B}")):
        result = runner.invoke(main, ["estimate", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output


@needs_build
@pytest.mark.parametrize("name,settings", [("mlp", None), ("gpt_train", ("default",)),
                                           ("cnn_sgd", ("expandable",))])
def test_the_shipped_gpu_recordings_within_tolerance(name, settings):
    """The H200 recordings of bench/estimate_workloads.py (tests/data/estimate_truth.jsonl):
    the estimate's peak reserved within 3% (mlp under every recorded setting; the whole table is
    bench/estimate_accuracy.py's)."""
    from npumem.estimate.run import estimate
    rows = [json.loads(line) for line in open(TRUTH)]
    for row in (r for r in rows if r["name"] == name and (settings is None or r["setting"] in settings)):
        result = estimate(os.path.join(ROOT, "bench", "estimate_workloads.py"), [name], gpu="h200",
                          settings=row["conf"], versions={"torch_version": row["torch"]})
        ratio = result.current.peak_reserved_bytes / row["peak_reserved"]
        assert abs(ratio - 1) <= 0.03, (name, row["setting"], ratio)


@needs_build
def test_attention_views_and_host_reads_as_on_a_gpu(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        with torch.device("cuda"):
            layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
            opt = torch.optim.AdamW(layer.parameters())
            for _ in range(2):
                layer(torch.randn(2, 16, 64)).sum().backward()
                opt.step()
        weight = layer.self_attn.in_proj_weight
        before = torch.cuda.memory_allocated()
        views = [weight.t(), weight.view(-1), weight[:8], weight.detach()]
        print("VIEWS", torch.cuda.memory_allocated() - before)
        values = weight.cpu().numpy()
        print("HOST", values.shape, weight[:2, :2].tolist())
        """, "--json")
    assert done.returncode == 0, done.stderr
    assert "VIEWS 0" in done.stderr                      # views share their base's memory
    assert "HOST (192, 64) [[0.0, 0.0], [0.0, 0.0]]" in done.stderr
    report = json.loads(done.stdout)
    # nn.MultiheadAttention reaches scaled_dot_product_attention from inside
    # F.multi_head_attention_forward: fp32 with dropout on sm_90 is memory-efficient attention
    assert report["fake_run"]["attention"] == {"efficient": 2}
    # what the fused kernel allocates is the user's line's, not npumem's or PyTorch's
    assert not any("site-packages" in row["line"] or "npumem" in row["line"]
                   for row in report["by_line"])
    assert any("numpy() of a device result" in note for note in report["fake_run"]["answers"])


@needs_build
def test_a_script_that_allocates_nothing_on_the_device(tmp_path):
    done = _estimate(tmp_path, "print(sum(range(10)))\n", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["peak_reserved_bytes"] == 0 and report["fits"]
    said = _estimate(tmp_path, "print(sum(range(10)))\n")
    assert "note: the script put nothing on the GPU" in said.stdout


@needs_build
def test_a_script_written_for_torch_npu_runs_on_the_stand_in_npu(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        import torch_npu
        from torch_npu.contrib import transfer_to_npu
        assert torch.npu.is_available()
        model = torch.nn.Linear(1024, 1024).npu()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            model(torch.randn(64, 1024, device="npu")).sum().backward()
            opt.step()
        print("DEVICE", model.weight.device, torch.npu.memory_allocated())
        """, "--device", "npu", "--json")
    assert done.returncode == 0, done.stderr
    line = next(l for l in done.stderr.splitlines() if l.startswith("DEVICE"))
    assert line.split()[1] == "npu:0"
    # weights, gradients and AdamW's two states of a 4 MiB weight, each padded by torch_npu
    assert int(line.split()[2]) >= 4 * 1024 * 1024 * 4
    report = json.loads(done.stdout)
    assert report["device"] == "npu" and report["peak_allocated_bytes"] >= 16 * MiB


@needs_build
def test_what_a_fake_run_does_in_place_of_the_script(tmp_path):
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"a good checkpoint")
    done = _estimate(tmp_path, f"""
        import torch
        model = torch.nn.Linear(16, 16).cuda()
        data = torch.utils.data.TensorDataset(torch.randn(64, 16))
        for (x,) in torch.utils.data.DataLoader(data, batch_size=8, num_workers=2, pin_memory=True):
            y = model(x.cuda(non_blocking=True))
        kept = y[y > 0]
        print("KEPT", kept.shape[0], torch.unique(y).shape[0])
        unfinished = torch.ones(4, dtype=torch.long, device="cuda")
        for step in range(100):                          # a generation loop's stopping test
            logits = torch.randn(4, 5000, device="cuda")
            done_now = torch.full((4,), step >= 7, dtype=torch.bool, device="cuda")
            unfinished = (logits.argmax(-1) > -1).long() * unfinished & ~done_now
            if unfinished.max() == 0:
                break
        print("STEPS", step)
        print(f"FMT {{torch.tensor(3.25, device='cuda'):.2f}} {{torch.randn(99999, device='cuda').sum():.1f}}")
        torch.save(model.state_dict(), {str(checkpoint)!r})
        """, "--json")
    # the stopping test reads a value made from a large tensor before step 7: a guess decides
    assert done.returncode == 3, done.stderr
    uncertain = json.loads(done.stdout)["uncertain"]
    assert [d["code"] for d in uncertain] == ["if unfinished.max() == 0:"]
    assert uncertain[0]["count"] == 7 and uncertain[0]["assumed"] is False
    assert checkpoint.read_bytes() == b"a good checkpoint"
    # y is small, so its values are real (shadows): x[mask] and unique give their true sizes
    kept, distinct = (int(v) for v in next(l for l in done.stderr.splitlines()
                                           if l.startswith("KEPT")).split()[1:])
    assert 0 < kept < 128 and distinct == 128 and "STEPS 7" in done.stderr
    assert "FMT 3.25 0.0" in done.stderr      # formatted as .item() gives it: shadow, or answer
    notes = json.loads(done.stdout)["fake_run"]["answers"]
    assert any("torch.save" in note for note in notes) and any("DataLoader" in note for note in notes)


@needs_build
def test_an_early_exit_is_a_failure_with_its_message(tmp_path):
    done = _estimate(tmp_path, """
        import sys, torch
        torch.ones(4, device="cuda")
        sys.exit("fatal: config missing")
        """)
    assert done.returncode == 1
    assert "fatal: config missing" in done.stderr and "exited with status 1" in done.stderr


@pytest.mark.parametrize("setting", ["default", "expandable", "split128", "pow2div8"])
def test_the_h200_recordings_under_each_setting_replay_exactly(setting):
    """The GPU recordings behind estimate_truth.jsonl's mlp lines (one per allocator setting):
    the allocator model reproduces every segment event of each, under the settings it ran with."""
    from npumem.trace.snapshot import load_recording
    from npumem.whatif.torch_replay import replay_recording
    recording = load_recording(os.path.join(HERE, "data", "cuda_snapshots_h200", f"mlp@{setting}.pickle.gz"))
    result = replay_recording(recording, recording.base_config(), check=True)
    truth = next(json.loads(line) for line in open(TRUTH)
                 if json.loads(line)["name"] == "mlp" and json.loads(line)["setting"] == setting)
    assert result.divergence is None and result.peak_reserved_bytes == truth["peak_reserved"]


@needs_build
def test_the_predicted_snapshot_opens_like_a_recorded_one(tmp_path):
    out = tmp_path / "pred"
    done = _estimate(tmp_path, """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)).cuda()
        opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
        for _ in range(3):
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
        """, "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    estimate = json.loads((out / "estimate.json").read_text())
    assert estimate == json.loads(done.stdout)
    from npumem.trace.snapshot import load_recording
    from npumem.whatif.torch_replay import replay_recording
    recording = load_recording(str(out / "predicted.pickle"))
    assert recording.predicted and recording.segments
    # the predicted snapshot's own segment events replay exactly, and say the estimate's peak
    result = replay_recording(recording, check=True)
    assert result.divergence is None
    assert result.recorded_peak_reserved_bytes == estimate["peak_reserved_bytes"]
    env = dict(os.environ)
    tuned = subprocess.run([sys.executable, "-m", "npumem", "tune", str(out / "predicted.pickle")],
                           capture_output=True, text=True, env=env, timeout=120)
    assert tuned.returncode == 0 and "npumem estimate's predicted run reserved" in tuned.stdout
    # an earlier estimate's files are written over only when asked to
    again = _estimate(tmp_path, "x = 1\n", "--out", str(out))
    assert again.returncode == 2 and "exists and is not empty" in again.stderr
    assert json.loads((out / "estimate.json").read_text()) == estimate
    forced = _estimate(tmp_path, "x = 1\n", "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert json.loads((out / "estimate.json").read_text())["peak_reserved_bytes"] == 0
