"""Coverage-guided fuzzing of one file reader with atheris (libFuzzer), for long runs.

    pip install atheris
    python tests/fuzz_atheris.py chrome -max_total_time=600 [more libFuzzer flags]

The reader is one of tests/fuzzing.py's TARGETS; its seed file starts the corpus. A crash
(anything but one of npumem's clear errors) stops the run and leaves the input in crash-*.
For a hostile-* target, libFuzzer's byte mutations alternate with tests/fuzzing.py's
structure-aware ones (a hostile snapshot, trace or plan made from the mutation's seed), and
libFuzzer's own limits bound each input: -rss_limit_mb=2048 -timeout=10 make a small file
that eats memory or time a crash too (the process itself, numpy and all, holds a few hundred
MiB; bench/fuzz_hostile.py measures each input's own). Counts from runs are in
docs/reliability.md.
"""

import os
import sys
import tempfile

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with atheris.instrument_imports(include=["npumem"]):
    from tests.fuzzing import TARGETS, check_one, mutate


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: fuzz_atheris.py {{{','.join(sorted(TARGETS))}}} [libFuzzer flags]")
    name = sys.argv.pop(1)
    make_seed, read, structure = TARGETS[name]
    work = tempfile.mkdtemp(prefix=f"npumem-fuzz-{name}-")
    corpus = os.path.join(work, "corpus")
    os.makedirs(corpus)
    with open(os.path.join(corpus, "seed"), "wb") as out:
        out.write(make_seed())
    path = os.path.join(work, "input")

    def one_input(data: bytes) -> None:
        check_one(read, path, data)              # raises ReaderCrash on anything unclear

    def hostile(data: bytes, max_size: int, seed: int) -> bytes:
        if seed % 2:                                # libFuzzer's own half
            return atheris.Mutate(data, max_size)
        import random
        return mutate(random.Random(seed), data, structure)[:max_size]

    if structure.startswith("hostile-"):
        atheris.Setup(sys.argv + [corpus], one_input, custom_mutator=hostile)
    else:
        atheris.Setup(sys.argv + [corpus], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
