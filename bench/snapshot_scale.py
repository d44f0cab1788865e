"""Snapshots at scale: make a PyTorch-shaped memory snapshot of millions of trace entries, then
time `npumem report`, `npumem replay` through the model of PyTorch's allocator (and `--check`)
and through npumem's pool, and `npumem tune` on it, with each command's peak RSS, against
PyTorch's own reader of the file (`_memory_viz trace_plot`).

    python bench/snapshot_scale.py [--entries 1M,10M] [--frames shared|copied] [--keep DIR]
                                   [--no-peer]

The snapshot is a real recording (the project's H100 gpt_train, tests/data/cuda_snapshots)
whose steady training step is repeated until the trace has --entries entries: the step begins
and ends with the same blocks live, so the repeated trace is one PyTorch could have recorded,
with the recording's own end state. It is written opcode by opcode, as pickle.dump would (keys
and frame dicts memoized, one frames list per entry), without building it in memory first.
`--frames copied` writes every frame out in full, as a pickler that shares nothing does: a file
about 3x larger for the same entries.

Each command runs in its own process; peak RSS is that process's own (os.wait4).
"""

from __future__ import annotations

import argparse
import gzip
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "tests", "data", "cuda_snapshots", "gpt_train.pickle.gz")


def steady_step(entries: list[dict]) -> tuple[int, int]:
    """(i, j): the longest stretch after the last segment_alloc that starts and ends with the same
    blocks live, so entries[i:j] can be repeated."""
    last_segment = max(k for k, e in enumerate(entries) if e["action"].startswith("segment"))
    live, seen = set(), {}
    best = (0, 0)
    for k, entry in enumerate(entries):
        if entry["action"] == "alloc":
            live.add(entry["addr"])
        elif entry["action"] == "free_completed":
            live.discard(entry["addr"])
        if k <= last_segment:
            continue
        key = frozenset(live)
        if key in seen and k + 1 - seen[key] > best[1] - best[0]:
            best = (seen[key], k + 1)
        seen.setdefault(key, k + 1)
    if best[1] - best[0] < 100:
        sys.exit(f"{SOURCE}: no repeating step found")
    return best


class PickleWriter:
    """Writes protocol-4 opcodes: the subset pickle.dump uses for dicts, lists, str and int."""

    def __init__(self, out):
        self.out, self.memo, self.count = out, {}, 0

    def raw(self, data: bytes) -> None:
        self.out.write(data)

    def memoize(self, key) -> None:
        self.memo[key] = self.count                          # the unpickler's next index
        self.count += 1
        self.raw(b"\x94")                                    # MEMOIZE

    def get(self, key) -> bool:
        index = self.memo.get(key)
        if index is None:
            return False
        self.raw(b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index))
        return True

    def text(self, value: str) -> None:
        if self.get(("s", value)):
            return
        data = value.encode()
        self.raw((b"\x8c" + bytes([len(data)]) if len(data) < 256 else
                  b"X" + struct.pack("<I", len(data))) + data)
        self.memoize(("s", value))

    def integer(self, value: int) -> None:
        if 0 <= value < 256:
            self.raw(b"K" + bytes([value]))
        elif -(1 << 31) <= value < (1 << 31):
            self.raw(b"J" + struct.pack("<i", value))
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.raw(b"\x8a" + bytes([len(data)]) + data)

    def value(self, value) -> None:
        if isinstance(value, str):
            self.text(value)
        elif isinstance(value, bool) or value is None:
            self.raw({None: b"N", True: b"\x88", False: b"\x89"}[value])
        elif isinstance(value, int):
            self.integer(value)
        elif isinstance(value, float):
            self.raw(b"G" + struct.pack(">d", value))
        elif isinstance(value, dict):
            self.raw(b"}")
            self.memoize(("obj", id(value)))
            if value:
                self.raw(b"(")
                for key, item in value.items():
                    self.value(key)
                    self.value(item)
                self.raw(b"u")                               # SETITEMS
        elif isinstance(value, (list, tuple)):
            self.raw(b"]")
            self.memoize(("obj", id(value)))
            for start in range(0, len(value), 1000):          # pickle batches appends by 1000
                self.raw(b"(")
                for item in value[start:start + 1000]:
                    self.value(item)
                self.raw(b"e")                               # APPENDS
        else:
            raise TypeError(type(value))


def make_snapshot(path: str, count: int, frames: str) -> int:
    """Write a snapshot of at least `count` trace entries to `path`; the number written."""
    with gzip.open(SOURCE) as source:
        data = pickle.load(source)
    entries = data["device_traces"][0]
    i, j = steady_step(entries)
    step, period = entries[i:j], entries[j - 1]["time_us"] - entries[i]["time_us"] + 1
    repeats = max(1, -(-(count - len(entries)) // len(step)))
    with open(path, "wb") as out:
        writer = PickleWriter(out)
        writer.raw(b"\x80\x04")
        writer.raw(b"}")
        writer.memoize(("top",))
        writer.raw(b"(")
        for key, value in data.items():
            if key != "device_traces":
                writer.value(key)
                writer.value(value)
        writer.value("device_traces")
        writer.raw(b"]")
        writer.memoize(("traces",))
        writer.raw(b"(]")
        writer.memoize(("device0",))
        written = 0

        def entry(item: dict, shift: int) -> None:
            nonlocal written
            writer.raw(b"}")
            writer.memoize(("entry", written))
            writer.raw(b"(")
            for key, value in item.items():
                writer.text(key)
                if key == "time_us":
                    writer.integer(value + shift)
                elif key == "frames" and frames == "shared":
                    writer.raw(b"]")
                    writer.memoize(("frames", written))
                    if value:
                        writer.raw(b"(")
                        for frame in value:
                            key_ = tuple(frame.items())
                            if not writer.get(("frame", key_)):
                                writer.value(frame)
                                writer.memo[("frame", key_)] = writer.memo.pop(("obj", id(frame)))
                        writer.raw(b"e")
                else:
                    writer.value(value)
            writer.raw(b"u")
            written += 1

        def batch(items, shift: int) -> None:
            for start in range(0, len(items), 1000):
                writer.raw(b"(")
                for item in items[start:start + 1000]:
                    entry(item, shift)
                writer.raw(b"e")

        batch(entries[:j], 0)
        for repeat in range(1, repeats + 1):
            batch(step, repeat * period)
        batch(entries[j:], repeats * period)
        writer.raw(b"e")                                     # APPENDS device 0 to device_traces
        writer.raw(b"u.")                                    # SETITEMS of the top dict, STOP
    return written


def run(command: list[str]) -> tuple[float, float, int, str]:
    """(seconds, peak RSS GiB of that child, exit status, last output line)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    lines = output.strip().splitlines()
    return seconds, usage.ru_maxrss / 2**20, child.returncode, lines[-1] if lines else ""


def measure(path: str, entries: int, peer: bool) -> None:
    npumem = [sys.executable, "-m", "npumem"]
    size = os.path.getsize(path) / 2**20
    print(f"{entries:,} entries, {size:,.0f} MiB snapshot")
    commands = [("report", npumem + ["report", path]),
                ("replay --allocator torch", npumem + ["replay", "--allocator", "torch", path]),
                ("replay --allocator pool", npumem + ["replay", "--allocator", "pool", path]),
                ("replay --check", npumem + ["replay", "--check", path]),
                ("tune", npumem + ["tune", path])]
    if peer:          # PyTorch's own reader of the same file: its trace plot (no GPU needed)
        with tempfile.NamedTemporaryFile(suffix=".html") as out:
            commands.append(("peer: _memory_viz trace_plot",
                             [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", path,
                              "-o", out.name]))
            times = _rows(commands, entries)
    else:
        times = _rows(commands, entries)
    if "peer: _memory_viz trace_plot" in times:
        peer_s = times["peer: _memory_viz trace_plot"]
        print("  ratios to the peer: " + ", ".join(f"{name} {seconds / peer_s:.2f}x"
                                                  for name, seconds in times.items()
                                                  if not name.startswith("peer")))


def _rows(commands, entries: int) -> dict[str, float]:
    times = {}
    for name, command in commands:
        seconds, peak, status, last = run(command)
        times[name] = seconds
        print(f"  {name:30s} {seconds:7.1f} s  {entries / seconds / 1e6:5.2f}M entries/s  "
              f"peak RSS {peak:5.2f} GiB  exit {status}" + (f"  ({last})" if status else ""))
    return times


def _has_torch() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return "an unknown CPU"


def entry_count(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", default="1M,10M", help="comma-separated counts (1M, 500K)")
    parser.add_argument("--frames", choices=("shared", "copied"), default="shared")
    parser.add_argument("--keep", help="write the snapshots to this folder and keep them")
    parser.add_argument("--make-only", action="store_true", help="write the snapshots, time nothing")
    parser.add_argument("--no-peer", action="store_true",
                        help="skip PyTorch's _memory_viz trace_plot on the same file")
    args = parser.parse_args()
    folder = args.keep or tempfile.mkdtemp(prefix="npumem-scale-")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    try:
        for count in map(entry_count, args.entries.split(",")):
            path = os.path.join(folder, f"scale_{count}_{args.frames}.pickle")
            if os.path.exists(path + ".entries"):          # kept from an earlier run
                with open(path + ".entries") as f:
                    written = int(f.read())
            else:
                start = time.perf_counter()
                written = make_snapshot(path, count, args.frames)
                with open(path + ".entries", "w") as f:
                    f.write(str(written))
                print(f"wrote {written:,} entries in {time.perf_counter() - start:.0f} s: {path}")
            if not args.make_only:
                measure(path, written, peer=not args.no_peer and _has_torch())
    finally:
        if not args.keep:
            for name in os.listdir(folder):
                os.unlink(os.path.join(folder, name))
            os.rmdir(folder)


if __name__ == "__main__":
    main()
