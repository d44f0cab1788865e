"""Installs npumem-profile.pth beside the packages, so that NPUMEM_PROFILE=1 profiles any Python
program (src/npumem/profile_hook.py). Everything else is in pyproject.toml.

A .pth file must sit directly in site-packages, which no pyproject.toml key of setuptools
places a file in: build_py puts it at the root of the wheel, and for an editable install
(`pip install -e .`) at the root of the editable wheel, which setuptools assembles in the
folder its `install` command targets.

It also builds the C extensions: the snapshot reader, the JSONL trace reader, the native
allocator model, the native pool for replays, the pool's statistics counts and free list, the
statistics adaptor's counts, the greedy placement and the planner's search."""

import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "npumem-profile.pth"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", PTH)


class BuildWithProfileHook(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            folder = self.get_finalized_command("install").install_lib
        else:
            folder = self.build_lib
        self.mkpath(folder)
        self.copy_file(SOURCE, os.path.join(folder, PTH), preserve_mode=False)

    def get_outputs(self, *args, **kwargs):
        outputs = super().get_outputs(*args, **kwargs)
        return outputs if getattr(self, "editable_mode", False) else \
            [*outputs, os.path.join(self.build_lib, PTH)]


COMMON = "src/npumem/trace/reader_common.h"   # what the readers share
LIVE_TABLE = "src/npumem/alloc/live_table.h"    # a hash of uint64 keys: live blocks, memo objects

# Snapshot pickles read into columns (src/npumem/trace/snapshot/_reader.c): plain C, no numpy
# headers, so building it needs only a compiler and Python's own headers.
SNAPSHOT_READER = Extension("npumem.trace.snapshot._reader",
                            ["src/npumem/trace/snapshot/_reader.c"],
                            depends=[COMMON, LIVE_TABLE, "src/npumem/trace/snapshot/memo.h"],
                            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

# npumem's JSONL traces read into the same columns (src/npumem/trace/_jsonl.c).
JSONL_READER = Extension("npumem.trace._jsonl", ["src/npumem/trace/_jsonl.c"], depends=[COMMON],
                         extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

# The model of PyTorch's caching allocator, native, for replays
# (src/npumem/alloc/torch_model/_native.c): plain C as well.
NATIVE_MODEL = Extension("npumem.alloc.torch_model._native",
                         ["src/npumem/alloc/torch_model/_native.c"], depends=[LIVE_TABLE],
                         extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

# npumem's default pool, native, for trace replays (src/npumem/alloc/_pool_replay.c).
POOL_REPLAY = Extension("npumem.alloc._pool_replay", ["src/npumem/alloc/_pool_replay.c"],
                        depends=[LIVE_TABLE],
                        extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

# The caching pool's statistics counts (src/npumem/alloc/_pool_stats.c): one call an event.
POOL_STATS = Extension("npumem.alloc._pool_stats", ["src/npumem/alloc/_pool_stats.c"],
                       extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

# The caching pool's index of free blocks (src/npumem/alloc/_free_list.c): best and first fit,
# the split on allocate and the merge on free.
FREE_LIST = Extension("npumem.alloc._free_list", ["src/npumem/alloc/_free_list.c"],
                      extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

# The statistics adaptor's counts and its counted allocate and free
# (src/npumem/alloc/_statistics_adaptor.c).
STATISTICS_ADAPTOR = Extension("npumem.alloc._statistics_adaptor",
                               ["src/npumem/alloc/_statistics_adaptor.c"],
                               extra_compile_args=["-O2", "-std=c99", "-Wall",
                                                   "-Wno-unused-function"])

# Greedy placement in a given order (src/npumem/planning/_placement.c): the planner's greedy
# stage and the predictive pool's step layouts.
PLACEMENT = Extension("npumem.planning._placement", ["src/npumem/planning/_placement.c"],
                      extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

# The planner's search for a placement within a capacity (src/npumem/planning/_search.c).
SEARCH = Extension("npumem.planning._search", ["src/npumem/planning/_search.c"],
                   extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-unused-function"])

setup(cmdclass={"build_py": BuildWithProfileHook},
      ext_modules=[SNAPSHOT_READER, JSONL_READER, NATIVE_MODEL, POOL_REPLAY, POOL_STATS,
                   FREE_LIST, STATISTICS_ADAPTOR, PLACEMENT, SEARCH])
