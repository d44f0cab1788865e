"""Whether `npumem tune`'s verdicts on a run that died hold on a real GPU (../shared/GPU.md, item 1).

bench/oom_agreement.py plays the GPU's part with the model; this runs the workloads of
bench/record_workloads.py on the GPU itself, under set_per_process_memory_fraction, and then
asks tune about the snapshots the OOM observer dumped.

    python3 bench/oom_gpu.py record OUT_DIR [--workloads ...] [--jobs 8]   # on the GPU machine
    python3 bench/oom_gpu.py pack OUT_DIR                                 # there, after record
    python bench/oom_gpu.py compare OUT_DIR                               # here, on the CPU

record: each workload runs once with no cap under the default settings, with the allocator's
history on (its snapshot is kept): its peak allocated (live) and peak reserved give four caps,
25/50/75/90% of the way from the one to the other (oom_agreement's LEVELS), rounded down to
a MiB. Then each cap runs under every setting tune considers there (its CANDIDATES, and the
garbage-collection thresholds it adds under a fraction), each run in a fresh process: the
setting in PYTORCH_CUDA_ALLOC_CONF before CUDA starts, the cap as
torch.cuda.set_per_process_memory_fraction(cap / the device's total memory), which caps the
memory the process reserves. An OOM observer (torch._C._cuda_attach_out_of_memory_observer,
docs/pytorch.md) takes the snapshot at each out-of-memory, with the limit c10 hands it, as
npumem.profile.dump_snapshot_on_oom keeps it; the one at the OOM the run died of is written
gzipped. OUT_DIR/results.jsonl gets a line per run. Runs go `--jobs` at a time (each process's
fraction caps only itself), each with its own timeout; no run starts after `--budget` seconds.
pack puts the snapshots in at most four tar files of at most 15 MiB (what a device call brings
back), the most useful first, and removes the folder.

compare: each cap where the run under the default settings died is tuned as `npumem tune
SNAPSHOT` tunes it, three ways: with the limit the observer kept (dump_snapshot_on_oom), with it
removed (the plain observer: tune infers the cap), and with `--memory` giving the cap. Each
candidate's verdict (fits / does not) is checked against whether that setting finished under
that cap on the GPU; and whether the recommendation (or the setting to try) finished. Also: the
model on the whole uncapped run (oom_agreement's truth) against the GPU, and `replay --check` on
every real OOM snapshot. Prints a table per cap, the totals, and markdown for docs/benchmarks.md.

    python3 bench/oom_gpu.py record OUT_DIR --dry-run     # the plan, with no GPU
    python bench/oom_gpu.py simulate OUT_DIR              # an OUT_DIR made by the model, to try compare
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [p for p in (os.path.join(ROOT, "src"), HERE) if p not in sys.path]

MiB = 1 << 20
# the order caps run in: a run cut short by --budget has the middle caps of every workload
LEVEL_ORDER = (0.5, 0.9, 0.25, 0.75)
# all of bench/record_workloads.py's eight but lstm (cuDNN's RNN: little to tune); the most
# telling first
WORKLOADS = ("gpt_generate", "cnn_wide", "encoder", "unet", "gpt_train", "cnn_sgd", "mlp")
H200_BYTES = 150109880320          # torch.cuda.get_device_properties(0).total_memory there
RESULTS = "results.jsonl"
# each child in a process group of its own, so that a timeout ends it whole
GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
PART_BYTES = 15 * MiB              # a device call brings back files of up to 16 MiB ...
MAX_PARTS = 4                      # ... 8 of them, 64 MiB in all
VARIANTS = (("observer", "fraction, observer's limit"), ("inferred", "fraction, inferred"),
            ("memory", "fraction, `--memory`"))


# tune's lists as of this script (npumem.whatif.torch_tune), used only where npumem does not
# import on the GPU machine: the run must not depend on the rest of the tree being whole
_CANDIDATES = ("", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:128",
               "max_split_size_mb:256", "max_split_size_mb:512", "roundup_power2_divisions:4",
               "roundup_power2_divisions:8", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
               "expandable_segments:True,roundup_power2_divisions:4",
               "max_split_size_mb:128,roundup_power2_divisions:4",
               "garbage_collection_threshold:0.6", "garbage_collection_threshold:0.8")


def settings_considered() -> list[str]:
    """What tune replays on a snapshot that died under a fraction: every candidate, and the
    garbage-collection thresholds (they act only under a fraction)."""
    try:
        from npumem.whatif.torch_tune import CANDIDATES, GC_CANDIDATES
    except Exception as exc:              # noqa: BLE001 - a tree mid-edit: the copy above
        print(f"WARNING: npumem.whatif.torch_tune does not import ({type(exc).__name__}: {exc}); "
              f"using this script's copy of its candidates", flush=True)
        return list(_CANDIDATES)
    return list(CANDIDATES) + list(GC_CANDIDATES)


def workloads() -> dict:
    """record_workloads' workloads. It imports npumem.trace only for its CPU recordings: where
    that does not import, a stand-in lets the GPU runs go on."""
    try:
        from record_workloads import _workloads
    except Exception as exc:              # noqa: BLE001
        import types
        print(f"WARNING: bench/record_workloads.py does not import ({type(exc).__name__}: "
              f"{exc}); trying it with a stand-in for npumem.trace", file=sys.stderr, flush=True)
        stub = types.ModuleType("npumem.trace")
        stub.read_trace = stub.write_trace = None
        sys.modules["npumem.trace"] = stub
        sys.modules.pop("record_workloads", None)
        from record_workloads import _workloads
    return _workloads()


def oom_key() -> str:
    try:
        from npumem.trace.snapshot.schema import OOM_KEY
    except Exception:                     # noqa: BLE001
        return "npumem_oom"
    return OOM_KEY


def slug(setting: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", setting).strip("-") or "default"


def cap_of(live: int, reserved: int, level: float) -> int:
    """oom_agreement.caps' rounding: down to a MiB."""
    return int(live + (reserved - live) * level) // MiB * MiB


def fraction_of(cap: int, total: int) -> float:
    """The fraction c10 turns back into `cap` bytes (it keeps size_t(fraction * total))."""
    return (cap + 0.5) / total


# --- the child: one run on the GPU, in a fresh process -------------------------------------

def child(spec: dict) -> None:
    """Run one workload (spec: name, cap, fraction, snapshot path, device); print RESULT and
    one JSON line. An out-of-memory is a result, not a failure: exit 0."""
    started = time.perf_counter()
    import torch

    OOM_KEY = oom_key()
    build = workloads()[spec["name"]]
    cuda = spec.get("device", "cuda") == "cuda"
    row = {"conf_seen": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "ooms_seen": 0}
    last: dict = {}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        row.update(gpu=props.name, total_memory=props.total_memory, torch=torch.__version__,
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        if spec.get("fraction"):
            torch.cuda.set_per_process_memory_fraction(spec["fraction"], 0)

        def observer(device, alloc, allowed, device_free):
            # docs/pytorch.md's observer, keeping the limit as dump_snapshot_on_oom does; every
            # OOM is taken (cuDNN catches some and tries another algorithm): the last one taken
            # before the exception is the one the run died of
            row["ooms_seen"] += 1
            try:
                snapshot = torch.cuda.memory._snapshot()
                snapshot[OOM_KEY] = {"device": int(device), "alloc_size": int(alloc),
                                     "allowed": int(allowed), "device_free": int(device_free),
                                     "device_total": int(props.total_memory)}
                last["snapshot"] = snapshot
            except Exception as exc:      # noqa: BLE001 - never into c10's OOM path
                row["observer_error"] = f"{type(exc).__name__}: {exc}"

        torch._C._cuda_attach_out_of_memory_observer(observer)
        torch.manual_seed(0)              # as record_workloads.record_cuda runs them
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    else:                                 # --smoke: the plumbing, on the CPU
        torch.manual_seed(0)
    work_started = time.perf_counter()
    error = None
    try:
        with torch.device("cuda" if cuda else "cpu"):
            run = build()
            run()
            if not cuda and spec.get("cap") and not spec.get("setting"):
                raise torch.cuda.OutOfMemoryError("smoke: the default setting 'dies' under a cap")
        if cuda:
            torch.cuda.synchronize()
        finished = True
    except torch.cuda.OutOfMemoryError as exc:
        finished, error = False, f"OutOfMemoryError: {str(exc).splitlines()[0][:300]}"
    except RuntimeError as exc:           # an OOM that reached here as another type
        if not (row["ooms_seen"] and "out of memory" in str(exc)):
            raise
        finished, error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    row.update(finished=finished, oom=not finished, error=error,
               work_seconds=round(time.perf_counter() - work_started, 3))
    snapshot = None
    if cuda:
        torch.cuda.synchronize()
        final = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        stats = torch.cuda.memory_stats()
        row.update(peak_reserved=stats.get("reserved_bytes.all.peak", 0),
                   peak_allocated=stats.get("allocated_bytes.all.peak", 0),
                   num_ooms=stats.get("num_ooms", 0), num_alloc_retries=stats.get("num_alloc_retries", 0),
                   applied=final.get("allocator_settings"))
        if not finished:
            snapshot = last.get("snapshot")
            limits = (snapshot or {}).get(OOM_KEY) or {}
            row.update(allowed=limits.get("allowed"), device_free=limits.get("device_free"),
                       alloc_size=limits.get("alloc_size"))
        elif not spec.get("cap"):
            snapshot = final              # the uncapped run: its whole snapshot (the model
                                          # still live, as record_workloads.record_cuda keeps it)
    else:                                 # --smoke: made-up peaks, to give the caps
        row.update(peak_reserved=200 * MiB, peak_allocated=100 * MiB, total_memory=H200_BYTES)
        if not finished or not spec.get("cap"):
            snapshot = {"segments": [], "device_traces": [[]], "smoke": True}
    if snapshot is not None and spec.get("snapshot"):
        os.makedirs(os.path.dirname(spec["snapshot"]), exist_ok=True)
        with gzip.open(spec["snapshot"] + ".partial", "wb", compresslevel=6) as out:
            pickle.dump(snapshot, out)
        os.replace(spec["snapshot"] + ".partial", spec["snapshot"])
        row["snapshot_bytes"] = os.path.getsize(spec["snapshot"])
        row["snapshot_entries"] = sum(len(t) for t in snapshot.get("device_traces") or [])
    row["seconds"] = round(time.perf_counter() - started, 3)
    print("RESULT " + json.dumps(row), flush=True)


# --- record: the runs, in parallel ------------------------------------------------------------

class Runner:
    """Runs children `jobs` at a time, each in its own process group with its own timeout;
    writes each result as a line of OUT_DIR/results.jsonl as it comes."""

    def __init__(self, out_dir: str, jobs: int, run_timeout: float, deadline: float, smoke: bool):
        self.out_dir, self.jobs, self.run_timeout = out_dir, jobs, run_timeout
        self.deadline, self.smoke = deadline, smoke
        self.lock = threading.Lock()
        self.live: set[subprocess.Popen] = set()
        self.results = open(os.path.join(out_dir, RESULTS), "a")
        self.done = 0
        self.total = 0
        self.started = time.monotonic()
        self.stopping = False

    def env(self, setting: str) -> dict:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=setting, OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1")
        # torch 2.9 to 2.11 read PYTORCH_ALLOC_CONF first: only the one set here may count
        env.pop("PYTORCH_ALLOC_CONF", None)
        return env

    def run(self, row: dict) -> dict:
        """Run one; `row` holds workload, setting, cap_bytes, fraction, level, kind."""
        snapshot = None
        if row["kind"] == "baseline":
            snapshot = os.path.join("snapshots", row["workload"], "baseline.pickle.gz")
        else:
            snapshot = os.path.join("snapshots", row["workload"],
                                    f"{row['cap_bytes'] // MiB}MiB_{slug(row['setting'])}.pickle.gz")
        spec = {"name": row["workload"], "setting": row["setting"], "cap": row["cap_bytes"],
                "fraction": row["fraction"], "snapshot": os.path.join(self.out_dir, snapshot),
                "device": "cpu" if self.smoke else "cuda"}
        began = time.monotonic()
        if self.stopping or began > self.deadline:
            return self.write({**row, "finished": None, "error": "not run: out of --budget"})
        process = subprocess.Popen([sys.executable, __file__, "child", json.dumps(spec)],
                                   env=self.env(row["setting"]), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, **GROUP)
        with self.lock:
            self.live.add(process)
        try:
            stdout, stderr = process.communicate(timeout=self.run_timeout)
        except subprocess.TimeoutExpired:
            self.kill(process)
            stdout, stderr = process.communicate()
            result = {"finished": None, "error": f"timed out after {self.run_timeout:.0f} s"}
        else:
            line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                tail = (stderr or stdout).strip().splitlines()[-3:]
                result = {"finished": None,
                          "error": f"exit {process.returncode}: " + " | ".join(tail)[-600:]}
            else:
                result = json.loads(line[len("RESULT "):])
        finally:
            with self.lock:
                self.live.discard(process)
        result["wall_seconds"] = round(time.monotonic() - began, 2)
        if result.get("snapshot_bytes"):
            result["snapshot"] = snapshot
        return self.write({**row, **result})

    def write(self, row: dict) -> dict:
        with self.lock:
            self.results.write(json.dumps(row) + "\n")
            self.results.flush()
            self.done += 1
            if not str(row.get("error") or "").startswith("not run"):
                print(progress_line(row, self.done, self.total, time.monotonic() - self.started),
                      flush=True)
        return row

    @staticmethod
    def kill(process: subprocess.Popen) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)     # its own group (GROUP)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        """SIGTERM (the driver's timeout): start nothing more, end the running children."""
        self.stopping = True
        with self.lock:
            for process in list(self.live):
                self.kill(process)

    def map(self, rows: list[dict]) -> list[dict]:
        from concurrent.futures import ThreadPoolExecutor
        self.total += len(rows)
        with ThreadPoolExecutor(self.jobs) as pool:
            return list(pool.map(self.run, rows))


def progress_line(row: dict, done: int, total: int, elapsed: float) -> str:
    if row.get("finished") is None:
        state = f"ERROR {row.get('error')}"
    else:
        state = "finished" if row["finished"] else "OOM" + (
            f" (allowed {row['allowed']} B)" if row.get("allowed") else "")
        state += (f"; peak reserved {row.get('peak_reserved', 0) / MiB:.0f} MiB, allocated "
                  f"{row.get('peak_allocated', 0) / MiB:.1f} MiB")
        if row.get("ooms_seen", 0) > (0 if row["finished"] else 1):
            state += f"; {row['ooms_seen']} OOMs seen (caught ones too)"
    cap = "no cap" if not row.get("cap_bytes") else \
        f"cap {row['cap_bytes'] / MiB:.0f} MiB ({row['level']:.0%})"
    return (f"[{done}/{total} {elapsed:5.0f} s] {row['workload']:<13} {cap:<20} "
            f"{row['setting'] or 'default':<50} {state} in {row.get('wall_seconds', 0):.1f} s")


def applied_check(row: dict) -> str | None:
    """Why the settings the run reports are not the ones asked for; None when they are."""
    if row.get("applied") is None:
        return None
    try:
        from npumem.alloc.torch_model import from_snapshot, parse_config
    except Exception:                     # noqa: BLE001 - compare checks it again
        return None
    wanted, got = parse_config(row["setting"]), from_snapshot(row["applied"], "cuda")
    fields = ("expandable_segments", "max_split_size", "garbage_collection_threshold",
              "roundup_power2_divisions")
    if got.text == row["setting"] and all(getattr(got, f) == getattr(wanted, f) for f in fields):
        return None
    return f"asked {row['setting'] or 'default'!r}, the run reports {got.text!r} ({got.describe()})"


def plan_caps(live: int, reserved: int, levels) -> list[tuple[float, int]]:
    seen, caps = set(), []
    for level in levels:
        cap = cap_of(live, reserved, level)
        if cap not in seen and cap > 0:
            seen.add(cap)
            caps.append((level, cap))
    return caps


def capped_rows(workload: str, caps, settings, total: int) -> list[dict]:
    return [{"kind": "capped", "workload": workload, "setting": setting, "level": level,
             "cap_bytes": cap, "fraction": fraction_of(cap, total)}
            for level, cap in caps for setting in settings]


def ordered(rows: list[dict]) -> list[dict]:
    """By level (LEVEL_ORDER), then workload, then setting: a cut keeps whole caps."""
    rank = {level: i for i, level in enumerate(LEVEL_ORDER)}
    return sorted(rows, key=lambda r: rank.get(r["level"], len(rank)))


def record(args) -> None:
    known = list(workloads())
    unknown = sorted(set(args.workloads) - set(known))
    if unknown:
        sys.exit(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    settings = args.settings or settings_considered()
    levels = [float(x) for x in args.levels]
    if args.dry_run:
        return dry_run(args, settings, levels)
    os.makedirs(args.out_dir, exist_ok=True)
    if os.path.exists(os.path.join(args.out_dir, RESULTS)):
        sys.exit(f"{args.out_dir}/{RESULTS} exists: give an empty folder")
    started = time.monotonic()
    runner = Runner(args.out_dir, args.jobs, args.run_timeout, started + args.budget, args.smoke)
    signal.signal(signal.SIGTERM, lambda *_: (runner.stop(), sys.exit(143)))
    print(f"record: {len(args.workloads)} workloads, {len(settings)} settings, caps at "
          f"{', '.join(f'{x:.0%}' for x in levels)} of the way from peak live to peak reserved; "
          f"--jobs {args.jobs}, --run-timeout {args.run_timeout:.0f} s, --budget {args.budget:.0f} s",
          flush=True)
    baselines = runner.map([{"kind": "baseline", "workload": w, "setting": "", "level": None,
                             "cap_bytes": 0, "fraction": None} for w in args.workloads])
    rows = []
    for base in baselines:
        if not base.get("finished"):
            print(f"{base['workload']}: the uncapped run did not finish ({base.get('error')}): "
                  f"no caps for it", flush=True)
            continue
        total = base.get("total_memory") or H200_BYTES
        caps = plan_caps(base.get("peak_allocated", 0), base.get("peak_reserved", 0), levels)
        print(f"{base['workload']}: peak live {base.get('peak_allocated', 0) / MiB:.1f} MiB, peak "
              f"reserved {base.get('peak_reserved', 0) / MiB:.0f} MiB -> caps "
              + ", ".join(f"{cap / MiB:.0f} MiB" for _, cap in caps), flush=True)
        rows += capped_rows(base["workload"], caps, settings, total)
    walls = sorted(b["wall_seconds"] for b in baselines if b.get("wall_seconds"))
    if walls:
        each = walls[len(walls) // 2]
        print(f"{len(rows)} capped runs; at {each:.1f} s each (the baselines' median), about "
              f"{len(rows) * each / args.jobs:.0f} s with {args.jobs} at a time; "
              f"{max(0.0, started + args.budget - time.monotonic()):.0f} s of --budget left",
              flush=True)
    done = runner.map(ordered(rows))
    summarize(baselines + done)
    print(f"record: {time.monotonic() - started:.0f} s; {os.path.join(args.out_dir, RESULTS)}", flush=True)


def summarize(rows: list[dict]) -> None:
    """Per workload and cap: which settings finished (F), died (x), did not run (?)."""
    settings = list(dict.fromkeys(r["setting"] for r in rows if r["kind"] == "capped"))
    wrong = [(r, why) for r in rows if (why := applied_check(r))]
    for row, why in wrong[:10]:
        print(f"WARNING: {row['workload']} {row['setting'] or 'default'}: {why}", flush=True)
    print("\nsettings: " + "  ".join(f"{i}={s or 'default'}" for i, s in enumerate(settings)))
    groups: dict = {}
    for r in rows:
        if r["kind"] == "capped":
            groups.setdefault((r["workload"], r["cap_bytes"], r["level"]), {})[r["setting"]] = r
    for (workload, cap, level), runs in groups.items():
        marks = "".join("?" if runs.get(s, {}).get("finished") is None else
                        "F" if runs[s]["finished"] else "x" for s in settings)
        print(f"{workload:<13} {cap / MiB:>6.0f} MiB {level:>4.0%}  {marks}")
    errors = sum(1 for r in rows if r.get("finished") is None)
    print(f"{len(rows)} runs: {sum(1 for r in rows if r.get('finished'))} finished, "
          f"{sum(1 for r in rows if r.get('finished') is False)} OOM, {errors} not run or failed",
          flush=True)


def dry_run(args, settings, levels) -> None:
    """The plan without a GPU: caps guessed from the H100 recordings in tests/data, where there
    is one (the GPU's own baseline decides them)."""
    from oom_agreement import caps as recorded_caps
    print(f"plan: per workload one uncapped run (default settings), then each cap under each of "
          f"these {len(settings)} settings, each in a fresh process with")
    for setting in settings:
        print(f"    PYTORCH_CUDA_ALLOC_CONF={setting!r}")
    runs = 0
    for workload in args.workloads:
        path = os.path.join(ROOT, "tests/data/cuda_snapshots", f"{workload}.pickle.gz")
        caps, guess = [None] * len(set(levels)), "unknown until its baseline runs"
        if os.path.exists(path):
            try:
                caps, guess = recorded_caps(path), "from the H100 recording"
            except Exception:             # noqa: BLE001 - only a guess
                pass
        runs += 1 + len(caps) * len(settings)
        shown = ", ".join(f"{c / MiB:.0f} MiB (fraction {fraction_of(c, H200_BYTES):.3e})"
                          for c in caps if c) or "?"
        print(f"{workload:<13} caps {shown} [{guess}]: {1 + len(caps) * len(settings)} runs")
    print(f"{runs} runs; at {args.assume_seconds:.0f} s a run (import torch, CUDA start, the "
          f"workload with its history), {args.jobs} at a time: about "
          f"{runs * args.assume_seconds / args.jobs:.0f} s (no run starts after --budget "
          f"{args.budget:.0f} s; each is killed after --run-timeout {args.run_timeout:.0f} s)")


# --- pack: what a device call can bring back ---------------------------------------------------

def pack(args) -> None:
    """OUT_DIR/snapshots/ into snapshots-N.tar files (each at most PART_BYTES, MAX_PARTS of
    them): the baselines first, then the default setting's OOM snapshots (what compare tunes),
    then the rest, smallest first; what does not fit is left out and named."""
    folder = os.path.join(args.out_dir, "snapshots")
    files = sorted(glob.glob(os.path.join(folder, "*", "*.pickle.gz")))

    def rank(path):
        name = os.path.basename(path)
        return (0 if name.startswith("baseline") else 1 if name.endswith("_default.pickle.gz") else 2,
                os.path.getsize(path), path)
    parts: list[list[str]] = [[]]
    sizes = [0]
    left_out = []
    for path in sorted(files, key=rank):
        size = os.path.getsize(path) + 1024
        if sizes[-1] + size > PART_BYTES:
            if len(parts) == args.max_parts or size > PART_BYTES:
                left_out.append(path)
                continue
            parts.append([])
            sizes.append(0)
        parts[-1].append(path)
        sizes[-1] += size
    for number, members in enumerate(parts, 1):
        if not members:
            continue
        target = os.path.join(args.out_dir, f"snapshots-{number}.tar")
        with tarfile.open(target, "w") as tar:
            for path in members:
                tar.add(path, arcname=os.path.relpath(path, args.out_dir))
        print(f"{target}: {len(members)} snapshots, {os.path.getsize(target) / MiB:.1f} MiB")
    for path in left_out:
        print(f"left out (no room): {os.path.relpath(path, args.out_dir)}")
    import shutil
    shutil.rmtree(folder, ignore_errors=True)


# --- compare: tune's verdicts against the GPU, here ----------------------------------------------

def load_rows(out_dir: str) -> list[dict]:
    """OUT_DIR's results.jsonl, or results.jsonl.gz (as tests/data/cuda_oom_h200 keeps it)."""
    path = os.path.join(out_dir, RESULTS)
    opener = open if os.path.exists(path) else gzip.open
    with opener(path if os.path.exists(path) else path + ".gz", "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def snapshot_folder(out_dir: str, work: str | None) -> str:
    """Where the rows' snapshot paths resolve: OUT_DIR itself, or the tar files unpacked."""
    tars = sorted(glob.glob(os.path.join(out_dir, "snapshots-*.tar")))
    if not tars or os.path.isdir(os.path.join(out_dir, "snapshots")):
        return out_dir
    work = work or tempfile.mkdtemp(prefix="oom_gpu_")
    for path in tars:
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and not m.name.startswith(("/", ".."))
                       and ".." not in m.name.split("/")]
            tar.extractall(work, members=members)
    return work


def truth_key(setting: str, base) -> str:
    from npumem.alloc.torch_model import parse_config
    return parse_config(setting, base=base).describe() if setting else base.describe()


def tune_variant(path: str, variant: str, cap: int, steps: int, scratch: str):
    """tune as `npumem tune` runs it: observer (the snapshot as dumped, limit kept), inferred
    (the limit removed, as the plain observer writes it), memory (that, with --memory CAP)."""
    from npumem.trace.snapshot.schema import OOM_KEY
    from npumem.whatif.torch_replay import load_for_model
    from npumem.whatif.torch_tune import tune_recording
    if variant != "observer":
        with gzip.open(path, "rb") as handle:
            data = pickle.load(handle)
        data.pop(OOM_KEY, None)
        path = os.path.join(scratch, os.path.basename(path).replace(".pickle.gz", "_plain.pickle"))
        with open(path, "wb") as handle:
            pickle.dump(data, handle)
    recording = load_for_model(path)
    tuning = tune_recording(recording, cap if variant == "memory" else None, steps=steps)
    return recording, tuning


def judge(path: str, variant: str, cap: int, gpu: dict, steps: int, scratch: str) -> dict:
    """oom_agreement.judge, with the GPU's runs as the truth (`gpu`: setting -> finished)."""
    recording, tuning = tune_variant(path, variant, cap, steps, scratch)
    base = recording.base_config()
    truth = {truth_key(s, base): ok for s, ok in gpu.items() if ok is not None}

    def real(candidate):
        return truth.get(candidate.config.describe())
    judged = [(c, real(c)) for c in tuning.candidates]
    known = [(c, ok) for c, ok in judged if ok is not None]
    best, tried = tuning.best, tuning.worth_trying
    return {"agree": sum(c.finishes == ok for c, ok in known), "total": len(known),
            "unknown": len(judged) - len(known),
            "wrong": [(c.config.describe() or "default", c.finishes, ok) for c, ok in known
                      if c.finishes != ok],
            "held": None if best is None else real(best),
            "best": None if best is None else (best.config.describe() or "default"),
            "any_fits": any(ok for _, ok in known), "extended": tuning.extension is not None,
            "trial": None if tried is None else real(tried),
            "tried": None if tried is None else (tried.config.describe() or "default"),
            "memory": tuning.memory, "died_at": tuning.died_at, "caught_at": tuning.caught_at}


def advice_text(result: dict) -> str:
    held, trial = result["held"], result["trial"]
    text = (f"{result['best']}: finishes" if held else f"{result['best']}: FAILS" if held is False
            else f"{result['best']}: not run" if result["best"] else
            "none; one fits" if result["any_fits"] else "none, and none fits")
    if result["tried"] is not None:
        text += f"; 'try' {result['tried']} " + ("finishes" if trial else "fails" if trial is False
                                                   else "not run")
    return text


def compare(args) -> None:
    rows = load_rows(args.out_dir)
    folder = snapshot_folder(args.out_dir, args.work)
    scratch = tempfile.mkdtemp(prefix="oom_gpu_plain_")
    started = time.perf_counter()
    baselines = {r["workload"]: r for r in rows if r["kind"] == "baseline"}
    groups: dict = {}
    for r in rows:
        if r["kind"] == "capped":
            groups.setdefault((r["workload"], r["cap_bytes"]), []).append(r)
    gpu_info = next((r for r in rows if r.get("gpu")), {})
    if gpu_info:
        print(f"GPU runs: {gpu_info['gpu']}, torch {gpu_info.get('torch')}, CUDA "
              f"{gpu_info.get('cuda')}, cuDNN {gpu_info.get('cudnn')}")
    print(f"{len(rows)} runs: {sum(1 for r in rows if r.get('finished'))} finished, "
          f"{sum(1 for r in rows if r.get('finished') is False)} out of memory, "
          f"{sum(1 for r in rows if r.get('finished') is None)} not run or failed")
    for r in rows:
        why = applied_check(r)
        if why:
            print(f"WARNING: {r['workload']} {r.get('cap_bytes', 0) / MiB:.0f} MiB "
                  f"{r['setting'] or 'default'}: {why}: the run is left out")
            r["finished"] = None
    variants = [v for v in VARIANTS if v[0] in args.variants]
    print(f"{'workload':<13} {'cap':>8} {'level':>5} {'GPU':>6}  {'kind':<27} {'agree':>7}  "
          f"extended  recommendation")
    totals: dict = {}
    table = []
    model_agree = [0, 0]
    for (workload, cap), runs in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1])):
        gpu = {r["setting"]: r.get("finished") for r in runs}
        level = runs[0].get("level") or 0
        fits = sum(1 for ok in gpu.values() if ok)
        ran = sum(1 for ok in gpu.values() if ok is not None)
        default = next((r for r in runs if r["setting"] == ""), None)
        gpu_text = f"{fits}/{ran}"
        base_path = baselines.get(workload, {}).get("snapshot")
        if base_path and os.path.exists(os.path.join(folder, base_path)):
            try:
                model = model_truth(os.path.join(folder, base_path), cap, gpu)
            except Exception as exc:      # noqa: BLE001
                print(f"{workload}: the model on the uncapped run failed: {type(exc).__name__}: {exc}")
            else:
                model_agree[0] += model[0]
                model_agree[1] += model[1]
        if default is None or default.get("finished") is not False:
            state = ("the default setting finished: no OOM to tune" if default and default.get("finished")
                     else f"the default setting did not run ({(default or {}).get('error')})")
            print(f"{workload:<13} {cap / MiB:>4.0f} MiB {level:>5.0%} {gpu_text:>6}  {state}")
            table.append((workload, cap, level, gpu_text, None))
            continue
        path = default.get("snapshot") and os.path.join(folder, default["snapshot"])
        if not path or not os.path.exists(path):
            print(f"{workload:<13} {cap / MiB:>4.0f} MiB {level:>5.0%} {gpu_text:>6}  "
                  f"the OOM snapshot is missing")
            table.append((workload, cap, level, gpu_text, None))
            continue
        cap_given = default.get("allowed") or cap
        results = {}
        for variant, kind in variants:
            try:
                result = judge(path, variant, cap_given, gpu, args.steps, scratch)
            except Exception as exc:      # noqa: BLE001 - one bad snapshot, not the whole table
                print(f"{workload:<13} {cap / MiB:>4.0f} MiB {level:>5.0%} {gpu_text:>6}  {kind:<27} "
                      f"tune failed: {type(exc).__name__}: {exc}")
                continue
            results[variant] = result
            print(f"{workload:<13} {cap / MiB:>4.0f} MiB {level:>5.0%} {gpu_text:>6}  {kind:<27} "
                  f"{result['agree']:>3}/{result['total']:<3}  "
                  f"{'yes' if result['extended'] else 'no':<8}  {advice_text(result)}")
            if result["wrong"] and args.verbose:
                print("      disagree: " + "; ".join(
                    f"{s} (tune {'fits' if t else 'OOM'}, GPU {'finished' if g else 'OOM'})"
                    for s, t, g in result["wrong"]))
            if result["caught_at"] is not None:
                print(f"      note: an OOM caught at entry {result['caught_at']} before the one "
                      f"the run died of: tune judges the recording as a run that went on")
            row = totals.setdefault(kind, [0, 0, 0, 0, 0, 0, 0])
            held, trial = result["held"], result["trial"]
            row[0] += result["agree"]
            row[1] += result["total"]
            row[2] += held is True or (held is None and result["best"] is None
                                       and not result["any_fits"] and trial is None)
            row[3] += 1
            row[4] += held is False
            row[5] += result["tried"] is not None
            row[6] += trial is True
        table.append((workload, cap, level, gpu_text, results))
    print()
    for kind, (agree, total, right, runs, failed, tries, tried) in totals.items():
        print(f"{kind:<27} verdicts agree {agree}/{total} ({agree / max(total, 1):.1%}); a "
              f"recommendation (or 'none fits') right in {right}/{runs - tries} runs, wrong in "
              f"{failed}; only a setting to try (the run died before it repeated a step, or "
              f"repeats only a forward pass's layers): {tries} runs, it finished in {tried}")
    if model_agree[1]:
        print(f"the model on the whole uncapped run (oom_agreement's truth) agrees with the GPU on "
              f"{model_agree[0]}/{model_agree[1]} ({model_agree[0] / model_agree[1]:.1%}) runs")
    checks = replay_checks(rows, folder) if args.check else None
    kept = sorted((r.get("snapshot_bytes") or os.path.getsize(os.path.join(folder, r["snapshot"])),
                   r["snapshot"]) for r in rows
                  if r["kind"] == "capped" and r["setting"] == "" and r.get("snapshot")
                  and os.path.exists(os.path.join(folder, r["snapshot"])))
    if kept:
        print(f"the default setting's OOM snapshots ({len(kept)}; tests/data/cuda_oom_h200 keeps "
              f"those of the H200's run): " + ", ".join(f"{path} {size / 1000:.0f} KB"
                                              for size, path in kept))
    print(f"({time.perf_counter() - started:.0f} s)")
    print()
    print(markdown(table, totals, model_agree, checks, gpu_info, variants))


def model_truth(baseline: str, cap: int, gpu: dict) -> tuple[int, int]:
    """bench/oom_agreement.py's truth (the whole uncapped GPU run replayed under each setting
    on the cap, as a fraction) against what the GPU did: (agree, runs)."""
    from capped_recordings import truth
    agree = total = 0
    for setting, ok in gpu.items():
        if ok is None:
            continue
        total += 1
        agree += truth(baseline, cap, setting, "fraction") == ok
    return agree, total


def replay_checks(rows: list[dict], folder: str) -> dict:
    """`npumem replay --check` on every OOM snapshot (each under the settings it ran with):
    MATCH, and whether the model runs out of memory at the entry the GPU first did (the one the
    run died of, or one cuDNN caught and the run went on from: the replay refuses each
    recorded OOM where it MATCHes)."""
    from npumem.trace.snapshot import first_oom
    from npumem.whatif.torch_replay import load_for_model, replay_file
    out = {"snapshots": 0, "match": 0, "same_oom": 0, "mismatched": [], "not_match": []}
    for r in rows:
        if r["kind"] != "capped" or r.get("finished") is not False or not r.get("snapshot"):
            continue
        path = os.path.join(folder, r["snapshot"])
        if not os.path.exists(path):
            continue
        out["snapshots"] += 1
        try:
            result = replay_file(path, check=True)
            first = first_oom(load_for_model(path).entries)
        except Exception as exc:          # noqa: BLE001
            out["mismatched"].append(f"{r['workload']} {r['cap_bytes'] / MiB:.0f} MiB "
                                     f"{r['setting'] or 'default'}: {type(exc).__name__}: {exc}")
            continue
        out["match"] += result.faithful
        same = result.oom is not None and result.oom.get("index") == first
        out["same_oom"] += same
        name = f"{r['workload']} {r['cap_bytes'] / MiB:.0f} MiB {r['setting'] or 'default'}"
        if not result.faithful:
            out["not_match"].append(name)
        if not (result.faithful and same):
            out["mismatched"].append(name)
    print(f"replay --check on {out['snapshots']} OOM snapshots: {out['match']} MATCH, "
          f"{out['same_oom']} run out of memory at the entry the GPU first did")
    for name in out["not_match"]:
        print(f"    not MATCH: {name}")
    for name in [n for n in out["mismatched"] if n not in out["not_match"]][:20]:
        print(f"    MATCH, another OOM entry: {name}")
    return out


def markdown(table, totals, model_agree, checks, gpu_info, variants) -> str:
    kinds = [kind for _, kind in variants]
    lines = ["| workload | cap | settings that finished on the GPU | "
             + " | ".join(f"{k}: agree" for k in kinds) + " | recommendation (" + kinds[0] + ") |",
             "|---|---|---|" + "---|" * len(kinds) + "---|"]
    for workload, cap, level, gpu_text, results in table:
        if results is None:
            lines.append(f"| {workload} | {cap / MiB:.0f} MiB ({level:.0%}) | {gpu_text} | "
                         + " | ".join("default finished" for _ in kinds) + " | - |")
            continue
        cells = [f"{results[v]['agree']} / {results[v]['total']}" if v in results else "failed"
                 for v, _ in variants]
        first = next((results[v] for v, _ in variants if v in results), None)
        lines.append(f"| {workload} | {cap / MiB:.0f} MiB ({level:.0%}) | {gpu_text} | "
                     + " | ".join(cells) + f" | {advice_text(first) if first else '-'} |")
    lines += ["", "| limit | verdicts that agree | recommendation (or \"none fits\") right | "
              "only a setting to try: it finished |", "|---|---|---|---|"]
    for kind, (agree, total, right, runs, failed, tries, tried) in totals.items():
        lines.append(f"| {kind} | {agree} / {total} ({agree / max(total, 1):.1%}) | "
                     f"{right} of {runs - tries}" + (f" ({failed} wrong)" if failed else "")
                     + f" | {tried} of {tries} |")
    lines.append("")
    if gpu_info:
        lines.append(f"GPU: {gpu_info['gpu']}, PyTorch {gpu_info.get('torch')}, CUDA "
                     f"{gpu_info.get('cuda')}, cuDNN {gpu_info.get('cudnn')}.")
    if model_agree[1]:
        lines.append(f"The model on the whole uncapped run (oom_agreement's truth) against the "
                     f"GPU: {model_agree[0]} / {model_agree[1]}.")
    if checks:
        lines.append(f"`replay --check` on the {checks['snapshots']} real OOM snapshots: "
                     f"{checks['match']} MATCH, {checks['same_oom']} out of memory at the entry "
                     f"where the GPU first did.")
    return "\n".join(lines)


# --- simulate: an OUT_DIR made by the model, to try compare without a GPU ----------------------

def simulate(args) -> None:
    """What record would write were the GPU exactly the model: the H100 recordings of
    tests/data/cuda_snapshots as the baselines, capped_recordings' snapshots at the OOM (with
    the limit, as the observer keeps it) and its truth for each setting."""
    from capped_recordings import DEVICE, capped, truth

    from npumem.trace.snapshot import load_recording
    from npumem.trace.snapshot.schema import OOM_KEY
    from npumem.whatif.torch_replay import replay_recording
    os.makedirs(args.out_dir, exist_ok=True)
    settings = settings_considered()
    with open(os.path.join(args.out_dir, RESULTS), "w") as results:
        for workload in args.workloads:
            source = os.path.join(ROOT, "tests/data/cuda_snapshots", f"{workload}.pickle.gz")
            if not os.path.exists(source):
                continue
            full = replay_recording(load_recording(source))
            live, reserved = full.peak_allocated_bytes, full.peak_reserved_bytes
            base = os.path.join("snapshots", workload, "baseline.pickle.gz")
            os.makedirs(os.path.join(args.out_dir, "snapshots", workload), exist_ok=True)
            with open(source, "rb") as src, open(os.path.join(args.out_dir, base), "wb") as dst:
                dst.write(src.read())
            results.write(json.dumps({"kind": "baseline", "workload": workload, "setting": "",
                                      "level": None, "cap_bytes": 0, "fraction": None,
                                      "finished": True, "peak_reserved": reserved,
                                      "peak_allocated": live, "snapshot": base}) + "\n")
            for level, cap in plan_caps(live, reserved, args.levels):
                for setting in settings:
                    row = {"kind": "capped", "workload": workload, "setting": setting,
                           "level": level, "cap_bytes": cap, "fraction": cap / DEVICE,
                           "finished": truth(source, cap, setting, "fraction")}
                    if setting == "" and not row["finished"]:
                        snapshot = capped(source, cap, "fraction")
                        oom = snapshot["device_traces"][0][-1]
                        snapshot[OOM_KEY] = {"device": 0, "alloc_size": oom["size"], "allowed": cap,
                                             "device_free": oom["device_free"], "device_total": DEVICE}
                        row["snapshot"] = os.path.join("snapshots", workload,
                                                       f"{cap // MiB}MiB_default.pickle.gz")
                        with gzip.open(os.path.join(args.out_dir, row["snapshot"]), "wb") as out:
                            pickle.dump(snapshot, out)
                        row["allowed"] = cap
                    results.write(json.dumps(row) + "\n")
            print(f"{workload}: simulated", flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="on the GPU machine: run the workloads under caps")
    rec.add_argument("out_dir")
    rec.add_argument("--workloads", nargs="+", default=list(WORKLOADS),
                     help=f"default: {' '.join(WORKLOADS)} (lstm, mlp_amp, ... on request)")
    rec.add_argument("--levels", nargs="+", type=float, default=list(LEVEL_ORDER),
                     help="where the caps lie between peak live (0) and peak reserved (1)")
    rec.add_argument("--settings", nargs="+", default=None,
                     help="PYTORCH_CUDA_ALLOC_CONF values (default: every one tune considers)")
    rec.add_argument("--jobs", type=int, default=8)
    rec.add_argument("--run-timeout", type=float, default=60.0, help="seconds, each run")
    rec.add_argument("--budget", type=float, default=330.0,
                     help="seconds after which no run starts (the ones running end)")
    rec.add_argument("--dry-run", action="store_true", help="print the plan; needs no GPU")
    rec.add_argument("--assume-seconds", type=float, default=8.0,
                     help="--dry-run: a run's seconds, for the estimate")
    rec.add_argument("--smoke", action="store_true",
                     help="the plumbing on the CPU: no caps take effect, the default setting "
                          "'dies' under each cap")
    pk = commands.add_parser("pack", help="on the GPU machine: the snapshots into a few tar files")
    pk.add_argument("out_dir")
    pk.add_argument("--max-parts", type=int, default=MAX_PARTS)
    cmp_ = commands.add_parser("compare", help="here: tune's verdicts against the GPU's runs")
    cmp_.add_argument("out_dir")
    cmp_.add_argument("--steps", type=int, default=3)
    cmp_.add_argument("--work", default=None, help="where to unpack the tar files (default: a "
                      "temporary folder)")
    cmp_.add_argument("--variants", nargs="+", default=[v for v, _ in VARIANTS],
                      choices=[v for v, _ in VARIANTS])
    cmp_.add_argument("--no-check", dest="check", action="store_false",
                      help="skip replay --check on the OOM snapshots")
    cmp_.add_argument("-v", "--verbose", action="store_true", help="name each disagreement")
    sim = commands.add_parser("simulate", help="an OUT_DIR made by the model, to try compare")
    sim.add_argument("out_dir")
    sim.add_argument("--workloads", nargs="+", default=list(WORKLOADS) + ["lstm"])
    sim.add_argument("--levels", nargs="+", type=float, default=list(LEVEL_ORDER))
    args = parser.parse_args()
    if args.command in ("compare", "simulate"):
        sys.path.insert(0, os.path.join(ROOT, "tests"))
    {"record": record, "pack": pack, "compare": compare, "simulate": simulate}[args.command](args)


if __name__ == "__main__":
    main()
