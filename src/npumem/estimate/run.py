"""`npumem estimate`: run a script on fake device tensors (child.py, in its own process), then
replay what it asked for through the allocator model under the user's settings and under each
candidate setting, on the target's memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field

from ..alloc.torch_model import TorchAllocatorConfig, parse_config
from ..alloc.torch_model.config import npu_pad, read_env
from ..profile.analysis import by_category, group_by_site, live_after
from ..trace.snapshot import Recording, recording_from_data
from ..whatif.torch_replay import UNLIMITED, replay_recording
from ..whatif.torch_tune import tune_recording
from . import native
from .kernel_rules import MODELLED_LABEL
from .targets import Target, target as find_target

BOOT = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
        "from npumem.estimate.native import claim; claim(lib); "
        "from npumem.estimate.child import main; sys.exit(main(sys.argv[2]))")


class ScriptFailed(RuntimeError):
    """The script stopped under fake tensors; `failure` says where (child._describe_failure)."""

    def __init__(self, failure: dict, script: str):
        self.failure = failure
        file = failure.get("file") or script
        shown = os.path.relpath(file) if os.path.isabs(file) and not \
            os.path.relpath(file).startswith("..") else file          # as the user named it
        where = f"{shown}:{failure.get('line')}" if failure.get("line") else script
        operator = f" in {failure['operator']}" if failure.get("operator") else ""
        super().__init__(f"{where}: {failure.get('type')}{operator}: {failure.get('message')}")


@dataclass
class PredictedRecording(Recording):
    """A recording of a fake run: its settings are the ones the estimate was asked about."""
    config: TorchAllocatorConfig | None = None

    def base_config(self) -> TorchAllocatorConfig:
        return self.config


@dataclass
class Estimate:
    script: str
    target: Target
    capacity: int
    settings: str                       # the settings the script runs with ("" for defaults)
    run: dict                           # child.py's result: ops, seconds, notes, attention
    current: object                     # TorchReplay under `settings`, no capacity
    tuning: object                      # TorchTuning on `capacity`
    # peak reserved with every modelled cuDNN convolution workspace at the low and the high of
    # its range (conv_workspace.py), where there are any: the headline uses the likely ones
    low_peak_reserved: int | None = None
    high_peak_reserved: int | None = None
    composition: dict = field(default_factory=dict)
    snapshot: dict | None = None        # the fake run's recording (PyTorch snapshot, no segments)
    config: TorchAllocatorConfig | None = None   # the settings as the model reads them
    leaks: object = None                # profile.leak_analysis.LeakAnalysis of the predicted run

    @property
    def fits(self) -> bool:
        return self.current.peak_reserved_bytes <= self.capacity

    @property
    def recommended(self):
        return self.tuning.best

    @property
    def uncertain(self) -> list[dict]:
        """Each decision the script took on a value estimate assumed (decisions.py)."""
        return self.run.get("uncertain", [])

    @property
    def unmodelled(self) -> list[dict]:
        """Work the fake run met and the estimate does not model, as {what, count} (the
        verdict line says it)."""
        return self.run.get("unmodelled", [])

    def as_dict(self) -> dict:
        best = self.recommended
        return {"script": self.script, "target": self.target.name, "device": self.target.device,
                "capacity_bytes": self.capacity, "settings": self.settings,
                "peak_allocated_bytes": self.current.peak_allocated_bytes,
                "peak_reserved_bytes": self.current.peak_reserved_bytes,
                "peak_reserved_low_bytes": self.low_peak_reserved,
                "peak_reserved_high_bytes": self.high_peak_reserved,
                "fits": self.fits, "uncertain": self.uncertain, "unmodelled": self.unmodelled,
                "recommended": best.config.describe() if best is not None else None,
                "recommended_peak_reserved_bytes": best.decisive.peak_reserved_bytes if best else None,
                "candidates": [{"settings": c.config.describe(), "finishes": c.finishes,
                                "peak_reserved_bytes": c.decisive.peak_reserved_bytes,
                                "peak_allocated_bytes": c.decisive.peak_allocated_bytes}
                               for c in self.tuning.in_order()],
                "by_category": self.composition.get("category", {}),
                "by_line": self.composition.get("line", []),
                "kernel_workspaces": self.composition.get("kernels", {}),
                "models": self.run.get("versions"),
                **(self.leaks.to_json() if self.leaks is not None else {}),
                "fake_run": {k: self.run.get(k) for k in ("ops", "seconds", "op_seconds", "attention", "answers",
                                                          "unsupported", "convolutions",
                                                          "convolution_reasons",
                                                          "table_source")}}


def settings_for(device: str, overrides: list[str], environ=os.environ) -> str:
    """The allocator settings the script would run with: the environment's, then --set's on
    top (a later key wins, as in PyTorch's own parsing), as their canonical text."""
    flavour = "npu" if device == "npu" else "cuda"
    _, text, _ = read_env(flavour, environ)
    given = [o if ":" in o else o.replace("=", ":", 1) for o in overrides]
    return parse_config(",".join(filter(None, [text, *given])), flavour,
                        source="the environment's settings with --set").describe()


def estimate(script: str, args: list[str], device: str = "cuda", gpu: str | None = None,
             memory: int | None = None, settings: str = "", assume: dict | None = None,
             devices: int = 1, keep_snapshot: bool = False, script_output=None,
             versions: dict | None = None) -> Estimate:
    """`script_output`: where the script's stdout goes (a file object; default: ours);
    `versions`: the target's "torch_version" and "cudnn_version" where they differ from the
    installed PyTorch and the stand-in's cuDNN (versions.py)."""
    target = find_target(gpu, device)
    capacity = memory or target.capacity
    library = native.stand_in_library()
    flavour = "npu" if target.device == "npu" else "cuda"
    config, defaults = parse_config(settings, flavour), parse_config("", flavour)
    if flavour == "npu":
        config, defaults = (c.replace(pad=npu_pad(target.soc)) for c in (config, defaults))
    with tempfile.TemporaryDirectory(prefix="npumem-estimate-") as folder:
        spec = {"script": script, "args": args, "gpu": target.key, "device": target.device,
                "library": library, "capacity": capacity,
                "settings": settings, "assume": assume or {}, "devices": devices,
                **(versions or {}), "out": os.path.join(folder, "recording.pickle")}
        spec_path = os.path.join(folder, "spec.json")
        with open(spec_path, "w") as handle:
            json.dump(spec, handle)
        # NPUMEM_ESTIMATE: a script may skip what needs real data (documented in estimate.md)
        # TORCH_DEVICE_BACKEND_AUTOLOAD=0: an installed device backend (torch_npu registers one
        # in the torch.backends entry points) is not loaded by `import torch`: it would reach
        # for its own driver; the stand-in is the device, and `import torch_npu` gets estimate's
        env = dict(os.environ, NPUMEM_FAKE_DEVICES=str(devices), NPUMEM_ESTIMATE="1",
                   TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        env.pop("NPUMEM_PROFILE", None)
        returncode = _run_child([sys.executable, "-c", BOOT, library, spec_path], env, script_output)
        if not os.path.exists(spec["out"] + ".json"):
            raise ScriptFailed({"type": "the fake run ended without a result",
                                "message": f"exit status {returncode}"}, script)
        with open(spec["out"] + ".json") as handle:
            run = json.load(handle)
        if run.get("error"):
            raise ScriptFailed({**run["error"], "assumed": run.get("assumed", [])}, script)
        if run.get("status"):
            raise ScriptFailed({"type": "SystemExit", "exited": run["status"],
                                "message": f"the script exited with status {run['status']} "
                                           f"after {run['ops']:,} operator{'s' * (run['ops'] != 1)}"},
                               script)
        with open(spec["out"], "rb") as handle:
            snapshot = pickle.load(handle)
    # the PyTorch the fake run modelled: its variable is the one the advice names
    release = (run.get("versions") or {}).get("torch")
    recording = _recording(snapshot, script, flavour, config, release=release)
    current = replay_recording(recording, config, capacity=UNLIMITED)
    # every candidate as it stands, not on top of the settings the user has: those are `current`
    tuning = tune_recording(_recording(snapshot, script, flavour, defaults, release=release),
                            memory=capacity)
    low = high = None
    ranges = run.get("convolution_ranges") or []
    if ranges:
        def peak(sizes):
            return replay_recording(_recording(snapshot, script, flavour, config, sizes),
                                    config, capacity=UNLIMITED).peak_reserved_bytes
        low, high = peak([r[1] for r in ranges]), peak([r[2] for r in ranges])
    from ..profile.leak_analysis import analyze_recording

    return Estimate(script, target, capacity, settings, run, current, tuning, low, high,
                    composition(recording.entries), snapshot if keep_snapshot else None, config,
                    analyze_recording(recording))


def _run_child(command: list[str], env: dict, stdout=None) -> int:
    """Run the fake run's process; it ends with this one (Ctrl-C, a kill, an error here)."""
    child = subprocess.Popen(command, env=env, stdout=stdout, preexec_fn=_die_with_parent)
    try:
        return child.wait()
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass


def _recording(snapshot: dict, script: str, flavour: str, config, modelled: list | None = None,
               release: str | None = None):
    """The fake run's recording; `modelled`: new sizes for the modelled convolution workspaces,
    in the order they were made (0 drops one); `release`: the PyTorch version it modelled."""
    data = snapshot
    if modelled is not None:
        sizes = iter(modelled)
        resized: dict = {}                       # addr -> its new size
        traces = []
        for trace in snapshot["device_traces"]:
            kept = []
            for entry in trace:
                if entry["action"] == "alloc" and entry.get("user_metadata") == MODELLED_LABEL:
                    resized[entry["addr"]] = next(sizes, entry["size"])
                size = resized.get(entry["addr"])
                if size is None:
                    kept.append(entry)
                elif size:
                    kept.append(dict(entry, size=size))
                if entry["action"] == "free_completed":
                    resized.pop(entry["addr"], None)
            traces.append(kept)
        data = {**snapshot, "device_traces": traces}
    if not any(data["device_traces"]):          # the script allocated nothing on the device
        return PredictedRecording(script, 0, flavour, None, [], [], config=config,
                                  torch_release=release)
    base = recording_from_data(data, script, 0, flavour)
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Recording)}
    values["torch_release"] = release
    return PredictedRecording(**values, config=config)


def composition(entries: list) -> dict:
    """What is live at the allocated peak: bytes by category, by the user's line (as `npumem
    report` groups them) and by kernel workspace (the rules' tag, in user_metadata)."""
    sizes: dict = {}
    total = peak = 0
    peak_at = -1
    for index, entry in enumerate(entries):
        if entry["action"] == "alloc":
            sizes[entry["addr"]] = entry["size"]
            total += entry["size"]
            if total > peak:
                peak, peak_at = total, index
        elif entry["action"] == "free_requested":
            total -= sizes.pop(entry["addr"], 0)
    live = live_after([], entries, peak_at) if peak_at >= 0 else []
    kernels: dict = defaultdict(int)
    for entry in live:
        if entry.get("user_metadata"):
            kernels[entry["user_metadata"]] += entry["size"]
    return {"peak": peak, "category": by_category(live), "kernels": dict(kernels),
            "line": [{"line": site.where, "bytes": site.bytes} for site in group_by_site(live)[:10]]}
