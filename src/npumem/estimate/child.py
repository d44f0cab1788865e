"""The process that runs the user's script under `npumem estimate` (started by run.py).

The stand-in device library is loaded before `import torch` (by the command line run.py
builds); then this module makes every tensor fake (FakeTensorMode: shapes, dtypes and devices,
no memory and no computation), records each storage the script creates and frees with its
stack and category (TensorRecorder), adds the allocations the GPU's kernels make on their own
(kernel_rules) and answers data-dependent questions (operators, shadows, answers), makes
PyTorch take the paths it takes on a GPU (fake_run: the attention kernel the target picks, among
others), and serves torch.cuda's calls from a live allocator model (device_api).
What it writes: the recording as a PyTorch snapshot (no segments yet: the parent replays it)
and a JSON file of notes, errors and counts.
"""

from __future__ import annotations

import json
import os
import pickle
import runpy
import sys
import time
import traceback

from .operators import ESTIMATED


def main(spec_path: str) -> int:
    with open(spec_path) as handle:
        spec = json.load(handle)
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

    from ..alloc.torch_model import parse_config
    from ..profile.tensor_recorder import TensorRecorder
    from . import device_api, fake_run, streams
    from .answers import Answers
    from .decisions import Decisions, install as install_decisions, script_globals
    from .versions import Modelled
    from .fake_cache import FakeCache
    from .kernel_rules import KernelRules
    from .operators import OperatorHook
    from .shadows import Shadows
    from .targets import target as find_target

    target = find_target(spec["gpu"], spec["device"])
    config = parse_config(spec["settings"], "npu" if target.device == "npu" else "cuda")
    recorder = TensorRecorder(max_events=spec.get("max_events", 50_000_000), stacks=True)
    recorder.backward_owners = True     # bytes of autograd's thread: the node, at its forward
    recorder.stream = streams.current   # each allocation in its stream's pool
    answers, rules = Answers(spec.get("assume")), KernelRules(target)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    hook = OperatorHook(torch, recorder, rules, Shadows(torch, FakeTensor, unset_fake_temporarily),
                        answers, FakeCache(torch, fake_mode))
    recorder.intercept = hook
    hook.progress = _Progress(answers)
    live = device_api.LiveModels(config)
    models: dict = {}                       # the recorder's device index -> its LiveModel

    def listener(action, key, size, device):
        model = models.get(device, False)
        if model is False:
            name = recorder.devices[device]         # "cuda:1"; None: not an estimated device
            model = models[device] = live.of(int(name.partition(":")[2] or 0)) \
                if name.startswith(ESTIMATED) else None
        if model is not None:
            model(action, key, size, device)

    recorder.listener = listener
    empty_cache_us: list = []

    def on_empty_cache():
        empty_cache_us.append((time.perf_counter_ns() - recorder.started_ns) / 1000.0)

    hook.empty_cache = on_empty_cache

    def on_dump(path=None):
        from .predicted import predicted_snapshot
        snapshot = predicted_snapshot(_estimated_traces(recorder.snapshot(), empty_cache_us), config)
        if path is None:
            return snapshot
        with open(path, "wb") as handle:
            pickle.dump(snapshot, handle)

    modelled = Modelled.from_spec(spec)
    chosen = fake_run.prepare(torch, target, answers, versions=modelled)
    decisions = Decisions()
    install_decisions(torch, answers, decisions)
    npu_strings = target.device == "npu" and _mentions_npu(spec["script"])
    if npu_strings:                           # PrivateUse1's hooks, before the first npu tensor
        import ctypes
        ctypes.CDLL(spec["library"]).npumem_stand_in_npu()
    # the host's random numbers stand in for the device's (small tensors' shadows): seeded, the
    # same command gives the same answer; a script's own manual_seed still wins
    torch.manual_seed(0)
    device_api.install(torch, target, spec.get("capacity") or target.capacity, live,
                       spec.get("devices", 1), on_empty_cache, on_dump, npu_strings)
    script = os.path.abspath(spec["script"])     # as Python gives __main__ its __file__
    sys.argv = [spec["script"], *spec["args"]]
    sys.path.insert(0, os.path.dirname(script))
    result = {"error": None, "status": 0}
    started = time.perf_counter()
    with fake_mode:
        recorder.start()
        try:
            runpy.run_path(script, init_globals=script_globals(), run_name="__main__")
        except SystemExit as exc:                 # as Python ends on it: a message, a status
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            result["status"] = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException as exc:              # the script failed under fake tensors
            result.update(error=_describe_failure(exc, spec["script"]), status=1)
            if os.environ.get("NPUMEM_ESTIMATE_TRACEBACK"):
                traceback.print_exc()
        finally:
            recorder.stop()
    result.update(seconds=time.perf_counter() - started, ops=hook.calls,
                  op_seconds=hook.nanoseconds / 1e9, unsupported=hook.unsupported,
                  cache={"hits": hook.fake.hits, "misses": hook.fake.misses, "views": hook.fake.views},
                  attention=chosen, answers=answers.notes(), assumed=answers.assumptions(),
                  uncertain=decisions.as_list(), lines_given=dict(answers.lines_used),
                  versions=modelled.as_dict(),
                  unmodelled=[{"what": text, "count": count}
                              for text, count in answers.unmodelled_seen.items()],
                  convolutions=rules.convolution_counts, convolution_ranges=rules.convolution_ranges,
                  convolution_reasons=rules.convolution_reasons, table_source=rules.table_source)
    with open(spec["out"] + ".partial", "wb") as handle:
        pickle.dump(_estimated_traces(recorder.snapshot(), empty_cache_us), handle)
    os.replace(spec["out"] + ".partial", spec["out"])
    with open(spec["out"] + ".json", "w") as handle:
        json.dump(result, handle)
    return 0


class _Progress:
    """A line on stderr every SECONDS of a long fake run: how far it got, and the assumption
    made most often so far (a loop that waits for a value no fake run can give spins on one)."""

    SECONDS = 15.0

    def __init__(self, answers):
        self.answers = answers
        self.started = self.last = time.perf_counter()

    def __call__(self, operators: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.SECONDS:
            return
        self.last = now
        line = f"npumem estimate: fake run at {operators:,} operators, {now - self.started:.0f} s"
        common = self.answers.given.most_common(1)
        if common:
            (kind, made_by), count = common[0]
            line += f"; most often assumed: {kind} value of {made_by}() ({count:,} times"
            line += f"; --assume {kind}=VALUE changes it)" if kind in ("bool", "int", "float") else ")"
        print(line, file=sys.stderr, flush=True)


def _mentions_npu(script: str) -> bool:
    """Whether a script is written for torch_npu ("npu" devices), not for cuda: then "npu"
    becomes a device. Otherwise the script's cuda tensors stand for the NPU's, as
    transfer_to_npu runs them (autograd cannot mix the two kinds of stand-in)."""
    try:
        with open(script, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return False
    return any(mark in text for mark in ("torch_npu", '"npu', "'npu", ".npu("))


def _estimated_traces(snapshot: dict, empty_cache_us: list) -> dict:
    """The recorder's snapshot with the device traces of estimated devices alone (by index), and
    each empty_cache() as the segment_free that npumem's replay reads as one."""
    devices = snapshot["npumem"]["devices"]
    traces: list = []
    for name, trace in zip(devices, snapshot["device_traces"]):
        if not name.startswith(ESTIMATED):
            continue
        index = int(name.split(":")[1]) if ":" in name else 0
        while len(traces) <= index:
            traces.append([])
        traces[index] = trace
    if not traces:
        traces = [[]]
    for when in empty_cache_us:
        for trace in traces:
            at = next((i for i, entry in enumerate(trace) if entry["time_us"] > when), len(trace))
            trace.insert(at, {"action": "segment_free", "addr": 0, "size": 0, "stream": 0,
                              "time_us": when, "frames": []})
    # each step mark on the trace it belongs to (numbered as the traces are now), placed by its
    # time: the segment_free entries above, and the workspaces a model later drops, move the
    # entry numbers the recorder wrote
    annotations = []
    for note in snapshot.get("external_annotations", []):
        device = note.get("device", 0)
        if device < len(devices) and devices[device].startswith(ESTIMATED):
            name = devices[device]
            note = {key: value for key, value in note.items() if key != "npumem_entry"}
            annotations.append(dict(note, device=int(name.split(":")[1]) if ":" in name else 0))
    return {**snapshot, "device_traces": traces, "external_annotations": annotations}


def _describe_failure(exc: BaseException, script: str) -> dict:
    """The exception, the operator it names (fake tensor errors carry it), the user's line that
    reached it (the deepest frame outside Python's, PyTorch's and npumem's files), and whether it
    is `ordinary`: raised by the user's own code (or a syntax error), as on a GPU."""
    from ..profile.analysis import is_library
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not is_library(f.filename)] or \
        [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(script)]
    where = user[-1] if user else (frames[-1] if frames else None)
    operator = getattr(exc, "func", None)
    message = str(exc).splitlines()[0][:500] if str(exc) else ""
    if "DispatchStub: missing kernel for cuda" in str(exc):
        message = ("PyTorch has no fake-device path for this operator (a kernel reached only "
                   "through a CUDA dispatch stub, as cuDNN RNNs are: nn.LSTM, nn.GRU, nn.RNN)")
    failure = {"type": type(exc).__name__, "message": message,
               "operator": str(operator) if operator is not None else None,
               "file": where.filename if where else None, "line": where.lineno if where else None,
               "code": where.line if where else None,
               "ordinary": isinstance(exc, ImportError) or (
                   bool(frames) and frames[-1] is where and operator is None)}
    if isinstance(exc, SyntaxError):
        failure.update(file=exc.filename, line=exc.lineno, code=(exc.text or "").strip(),
                       message=exc.msg, ordinary=True)
    return failure
