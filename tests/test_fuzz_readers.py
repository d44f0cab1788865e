"""Every file reader, fed thousands of mutated files: only clear errors that name the file.

NPUMEM_FUZZ_COUNT sets the inputs per reader (default 2500); NPUMEM_FUZZ_SEED the first seed.
The hostile-* targets (issue 64: structure-aware hostile snapshots, traces and plans, each
read through the allocator model) take NPUMEM_FUZZ_HOSTILE_COUNT (default 12: each costs a
replay or a tune); bench/fuzz_hostile.py runs them longer, with RSS and time.
A failure prints the seed and the input, and leaves the file in the test's tmp folder.
"""

import os
import random

import pytest

from .fuzzing import TARGETS, ReaderCrash, check_one, mutate

COUNT = int(os.environ.get("NPUMEM_FUZZ_COUNT", "2500"))
HOSTILE_COUNT = int(os.environ.get("NPUMEM_FUZZ_HOSTILE_COUNT", "12"))
SEED = int(os.environ.get("NPUMEM_FUZZ_SEED", "0"))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutated_files_get_clear_errors(name, tmp_path):
    make_seed, read, structure = TARGETS[name]
    seed = make_seed()
    check_one(read, str(tmp_path / "seed.bin"), seed)        # the seed itself reads cleanly
    rng = random.Random(f"{name}:{SEED}")
    crashes = []
    for index in range(HOSTILE_COUNT if structure.startswith("hostile-") else COUNT):
        data = mutate(rng, seed, structure)
        path = str(tmp_path / f"input{index}.bin")
        try:
            check_one(read, path, data)
        except ReaderCrash as exc:
            crashes.append(f"input {index} ({path}): {exc}\n    {data[:200]!r}")
            if len(crashes) >= 10:
                break
        else:
            os.unlink(path)
    assert not crashes, f"{len(crashes)} crash(es) reading mutated {name} files:\n" + \
        "\n".join(crashes)
