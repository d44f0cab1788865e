"""torch_npu's caching allocator, rule by rule, against its source.

Each test names the code it checks: torch_npu (github.com/Ascend/pytorch) at master 9e73e708a
(torch_npu 2.13-2.15), files torch_npu/csrc/core/npu/NPUCachingAllocator.cpp (NCA) and
NPUAllocatorConfig.cpp (NAC), and c10/core/AllocatorConfig.cpp of PyTorch, which torch_npu
delegates its common keys to. Which torch_npu releases each rule holds for: docs/pytorch.md.
"""

from __future__ import annotations

import pickle

import pytest
from click.testing import CliRunner

from npumem.alloc.torch_model import DeviceMemory, TorchAllocatorModel, parse_config, round_size
from npumem.alloc.torch_model.config import config_warnings, npu_pad
from npumem.cli import main
from npumem.errors import InvalidParamError

from .torch_recorder import record

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def npu_model(settings: str = "", capacity: int | None = None, **changes) -> TorchAllocatorModel:
    config = parse_config(settings, "npu")
    if changes:
        config = config.replace(**changes)
    return TorchAllocatorModel(config, DeviceMemory(capacity))


def segment_sizes(model) -> list[int]:
    return [event.size for event in model.stats.events]


# --- the 32-byte pad: NCA AddPadSize (l.161), applied first in round_size (l.2203) ------------

def test_every_request_is_padded_by_32_bytes_before_rounding():
    model = npu_model()
    model.malloc(1 * MiB)                  # 1 MiB + 32 is over kSmallSize: the large pool
    assert segment_sizes(model) == [20 * MiB]
    assert round_size(480, model.config) == 512 and round_size(481, model.config) == 1024


@pytest.mark.parametrize("soc, cann, pad", [
    ("Ascend910B3", "9.1.0", 32),          # not an Ascend950: always 32
    ("Ascend910_9391", "10.0.0", 32),
    ("Ascend950PR", "9.1.0", 0),           # kMinDel32PaddingSizeCannVersion = "9.1.0"
    ("Ascend950DT", "9.2.RC1", 0),
    ("Ascend950PR", "9.1.RC1", 32),        # a release candidate comes before 9.1.0
    ("Ascend950PR", "8.5.0", 32),
])
def test_the_pad_is_dropped_on_ascend950_with_cann_9_1(soc, cann, pad):
    # NCA l.165: GetSocVersion() >= Ascend950 && IsGteCANNVersion("9.1.0"); NpuVariables.cpp
    # reads any SoC name that starts with "Ascend950" as Ascend950
    assert npu_pad(soc, cann) == pad


def test_without_the_pad_a_1_mib_request_stays_in_the_small_pool():
    model = npu_model(pad=npu_pad("Ascend950PR", "9.1.0"))
    model.malloc(1 * MiB)
    assert segment_sizes(model) == [2 * MiB]


def test_a_chip_or_cann_version_torch_npu_would_not_read_is_refused():
    with pytest.raises(InvalidParamError, match="8.1.RC1 or 9.1.0"):
        npu_pad("Ascend950PR", "nine")
    with pytest.raises(InvalidParamError, match="did you mean 'Ascend910B3'"):
        npu_pad("Ascend910b3", "8.5.0")          # SetSocVersion stops on an unknown name


# --- segments from aclrtMallocAlign32: NCA alloc_block (l.3011) --------------------------------

def test_a_segment_takes_exactly_its_size_from_the_device():
    # aclrtMallocAlign32 only aligns to 32 bytes, where aclrtMalloc adds 32 bytes more: a
    # 20 MiB segment and a 2 MiB one fill a device of exactly 22 MiB
    model = npu_model(capacity=22 * MiB)
    model.malloc(5 * MiB)
    model.malloc(100 * KiB)
    assert model.device.used == 22 * MiB and model.device.free_bytes() == 0


# --- blocks of 2 MiB or more start on base_addr_aligned_kb: NCA malloc (l.1397-1420) --------------

def test_large_blocks_in_expandable_segments_start_on_16_kib():
    model = npu_model("expandable_segments:True")
    first = model.malloc(1 * MiB + 1)                 # 1 MiB + 1024 after the pad: unaligned end
    second = model.malloc(2 * MiB)
    assert first.addr % (16 * KiB) == 0 and (first.addr + first.size) % (16 * KiB) != 0
    assert second.addr % (16 * KiB) == 0 and second.addr > first.addr + first.size
    gap = second.prev                               # the bytes skipped stay in the pool
    assert gap is not None and not gap.allocated and gap.prev is first
    assert gap.addr + gap.size == second.addr and gap.size < 16 * KiB


@pytest.mark.parametrize("settings, size", [
    ("expandable_segments:True,base_addr_aligned_kb:0", 2 * MiB),   # 0 turns it off
    ("expandable_segments:True", 2 * MiB - 1024),                    # under kRoundLarge
    ("", 2 * MiB),                                                   # fixed segments
])
def test_the_alignment_applies_only_where_the_source_applies_it(settings, size):
    model = npu_model(settings)
    first = model.malloc(1 * MiB + 1)
    second = model.malloc(size)
    if settings:
        assert second.addr == first.addr + first.size
    else:                                   # each large request misses into its own segment
        assert second.addr % (16 * KiB) != 0 or second.segment is None


def test_base_addr_aligned_kb_is_read_as_torch_npu_reads_it():
    # NAC parseAddrAlignSize: digits, the same length once read as a number, at most 16
    assert parse_config("base_addr_aligned_kb:8", "npu").base_addr_aligned_kb == 8
    for text in ("17", "016", "-1", "8k"):
        with pytest.raises(InvalidParamError, match="base_addr_aligned_kb"):
            parse_config(f"base_addr_aligned_kb:{text}", "npu")


# --- page_size:1g: NCA IsMallocPage1GMem (l.130), malloc (l.1194), expandable (l.2463) --------

def test_page_size_1g_gives_the_large_pool_1_gib_segments_and_pages():
    fixed = npu_model("page_size:1g")
    fixed.malloc(3 * MiB)
    fixed.malloc(1500 * MiB)
    fixed.malloc(100 * KiB)                            # the small pool keeps 2 MiB segments
    assert segment_sizes(fixed) == [1 * GiB, 2 * GiB, 2 * MiB]
    expandable = npu_model("expandable_segments:True,page_size:1g")
    expandable.malloc(3 * MiB)
    assert [(e.action, e.size) for e in expandable.stats.events] == [("segment_map", 1 * GiB)]


def test_page_size_1g_says_what_it_needs_and_what_it_overrides():
    notes = config_warnings(parse_config("page_size:1g,large_segment_size_mb:64", "npu"))
    assert any("CANN 8.1.RC1 and driver 25.0.RC1" in note for note in notes)
    assert any("overrides large_segment_size_mb" in note for note in notes)
    with pytest.raises(InvalidParamError, match="page_size takes 1g only"):
        parse_config("page_size:2m", "npu")


# --- large_segment_size_mb and segment_size_mb: NCA get_allocation_size (l.2771),
#     get_custom_expandable_segment_size (l.2762) --------------------------------------------

@pytest.mark.parametrize("settings, fixed_segment, expandable_page", [
    ("", 20 * MiB, 20 * MiB),
    ("large_segment_size_mb:40", 40 * MiB, 40 * MiB),
    ("segment_size_mb:64", 20 * MiB, 64 * MiB),            # the expandable page only
    ("large_segment_size_mb:40,segment_size_mb:64", 40 * MiB, 40 * MiB),   # large wins
    ("segment_size_mb:64,large_segment_size_mb:20", 20 * MiB, 64 * MiB),   # 20: "not set"
])
def test_which_segment_size_applies_where(settings, fixed_segment, expandable_page):
    fixed = npu_model(settings)
    fixed.malloc(5 * MiB)                                  # between 1 and 10 MiB
    assert segment_sizes(fixed) == [fixed_segment]
    expandable = npu_model(",".join(filter(None, [settings, "expandable_segments:True"])))
    expandable.malloc(5 * MiB)
    assert segment_sizes(expandable) == [expandable_page]


def test_both_segment_sizes_set_is_noted_as_torch_npu_warns():
    notes = config_warnings(parse_config("large_segment_size_mb:40,segment_size_mb:64", "npu"))
    assert any("large_segment_size_mb wins" in note for note in notes)
    assert any("segment_size_mb is deprecated" in note for note in notes)
    with pytest.raises(InvalidParamError, match=r"segment_size_mb must be in \[20, 512\]"):
        parse_config("segment_size_mb:513", "npu")


# --- max_split_size_mb is at least the large segment size; the large segment size is the
#     default of max_non_split_rounding_mb: c10 AcceleratorAllocatorConfig::parseArgs --------

@pytest.mark.parametrize("text", ["large_segment_size_mb:40,max_split_size_mb:30",
                                  "max_split_size_mb:30,large_segment_size_mb:40",
                                  "max_non_split_rounding_mb:30,large_segment_size_mb:40"])
def test_max_split_size_below_the_large_segment_size_is_refused_in_any_order(text):
    with pytest.raises(InvalidParamError, match="must be >= 40"):
        parse_config(text, "npu")


def test_a_larger_segment_size_widens_the_rounding_of_oversize_blocks():
    config = parse_config("large_segment_size_mb:40,max_split_size_mb:40", "npu")
    assert config.max_non_split_rounding_size == 40 * MiB
    assert "max_non_split_rounding_mb" not in config.describe()
    model = TorchAllocatorModel(config)
    model.free(model.malloc(100 * MiB))                    # an oversize block, cached
    model.malloc(70 * MiB)       # 100 < 70 + 40: reused (with 20 MiB rounding it would not be)
    assert [e.action for e in model.stats.events] == ["segment_alloc"]
    explicit = parse_config("large_segment_size_mb:40,max_split_size_mb:40,"
                            "max_non_split_rounding_mb:50", "npu")
    assert explicit.max_non_split_rounding_size == 50 * MiB


# --- expandable_segments refuses max_split_size_mb and garbage_collection_threshold:
#     NAC parseArgs, after both parses ----------------------------------------------------------

@pytest.mark.parametrize("other", ["max_split_size_mb:64", "garbage_collection_threshold:0.6"])
def test_expandable_segments_with_a_split_or_gc_setting_stops_torch_npu(other):
    with pytest.raises(InvalidParamError, match="torch_npu refuses"):
        parse_config(f"expandable_segments:True,{other}", "npu")
    notes = config_warnings(parse_config(f"expandable_segments:True,{other}", "cuda"))
    assert any("torch_npu refuses" in note for note in notes)   # CUDA takes it; say so


# --- multi_stream_lazy_reclaim: NCA malloc (l.1177, l.1219) ---------------------------------------

def test_lazy_reclaim_is_kept_and_changes_no_placement():
    config = parse_config("multi_stream_lazy_reclaim:True", "npu")
    assert config.multi_stream_lazy_reclaim
    assert parse_config(config.describe(), "npu") == config
    assert any("multi_stream_lazy_reclaim" in note for note in config_warnings(config))
    workload = [("alloc", i, (i % 7 + 1) * 700 * KiB) for i in range(30)]
    workload += [("free", i) for i in range(0, 30, 3)] + [("alloc", 40, 3 * MiB)]
    lazy = record(workload, "multi_stream_lazy_reclaim:True", flavour="npu")
    eager = record(workload, "", flavour="npu")
    strip = [{k: v for k, v in e.items() if k != "time_us"}
             for e in lazy["device_traces"][0]]
    assert strip == [{k: v for k, v in e.items() if k != "time_us"}
                     for e in eager["device_traces"][0]]
    with pytest.raises(InvalidParamError, match="True or False"):
        parse_config("multi_stream_lazy_reclaim:yes", "npu")


# --- the virtual address range of an expandable segment: NCA ExpandableSegment (l.362) ----------

def test_an_expandable_segment_reserves_nine_eighths_of_the_device():
    # max_handles_ = numSegments(device_total + device_total / 8), segment_size_ each
    model = npu_model("expandable_segments:True", capacity=64 * GiB)
    model.malloc(30 * MiB)
    model.malloc(30 * MiB, stream=1)
    large = [s for s in model.expandable if s.page == 20 * MiB]
    expected = -(-(64 * GiB + 8 * GiB) // (20 * MiB)) * 20 * MiB
    assert [s.size for s in large] == [expected, expected]
    assert large[0].base + large[0].size <= large[1].base or large[1].base + expected <= large[0].base


# --- the command line: an Ascend950 run replayed without the pad ------------------------------

def test_replay_and_tune_take_the_chip(tmp_path):
    workload = [("alloc", i, 1 * MiB) for i in range(6)] + [("free", i) for i in range(6)]
    path = tmp_path / "npu.pickle"
    path.write_bytes(pickle.dumps(record(workload, "", flavour="npu")))
    runner = CliRunner()
    padded = runner.invoke(main, ["replay", str(path), "--allocator", "torch_npu", "--json"])
    unpadded = runner.invoke(main, ["replay", str(path), "--allocator", "torch_npu", "--json",
                                    "--soc", "Ascend950PR", "--cann", "9.1.0"])
    assert padded.exit_code == 0 and unpadded.exit_code == 0, padded.output + unpadded.output
    import json
    peak = [json.loads(r.output)[0]["peak_reserved_bytes"] for r in (padded, unpadded)]
    assert peak == [20 * MiB, 6 * MiB]              # 1 MiB + 32: large pool; 1 MiB: small
    tuned = runner.invoke(main, ["tune", str(path), "--allocator", "torch_npu",
                                 "--soc", "Ascend950PR", "--cann", "9.1.0"])
    assert tuned.exit_code == 0, tuned.output
    for args, words in ((["--allocator", "pool", "--soc", "Ascend950PR"], "torch_npu"),
                        (["--allocator", "torch_npu", "--cann", "soon"], "9.1.0")):
        bad = runner.invoke(main, ["replay", str(path), *args])
        assert bad.exit_code == 2 and words in bad.output and "Traceback" not in bad.output


# --- the keys: NAC kNPUSupportAccKeys (l.33) and NPUAllocatorConfig.h getKeys -----------------

def test_the_npu_keys_are_torch_npus():
    from npumem.alloc.torch_model.config import KEYS
    common = {"max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions",
              "expandable_segments", "pinned_use_background_threads", "large_segment_size_mb",
              "max_non_split_rounding_mb", "pinned_max_round_threshold_mb",
              "pinned_max_cached_size_mb"}
    own = {"pin_memory_expandable_segments", "pinned_mem_register", "base_addr_aligned_kb",
           "page_size", "segment_size_mb", "multi_stream_lazy_reclaim",
           "pinned_reserve_segment_size_mb", "per_process_memory_fraction",
           "release_lock_on_npumalloc", "throw_on_npumalloc_oom"}
    assert set(KEYS["npu"]) == common | own
    with pytest.raises(InvalidParamError, match="unknown key 'backend'"):
        parse_config("backend:native", "npu")      # a c10 key torch_npu does not take


def test_tune_leaves_out_the_settings_torch_npu_would_stop_on(tmp_path):
    from npumem.trace.snapshot import load_recording
    from npumem.whatif.torch_tune import tune_recording
    workload = [("alloc", i, (i % 5 + 1) * 3 * MiB) for i in range(12)]
    workload += [("free", i) for i in range(0, 12, 2)] + [("alloc", 20, 40 * MiB)]
    snapshot = record(workload, "expandable_segments:True", flavour="npu")
    snapshot["allocator_settings"] = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
                                      "expandable_segments": True}
    path = tmp_path / "expandable.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    recording = load_recording(str(path))
    assert recording.flavour == "npu"
    result = tune_recording(recording, workers=1)
    tried = [c.config for c in result.candidates]
    assert tried[0].expandable_segments                  # the recorded settings, first
    assert any(not c.expandable_segments for c in tried)  # and the run without them
    assert not any(c.expandable_segments and (c.max_split_size != (1 << 64) - 1
                                              or c.garbage_collection_threshold) for c in tried)
    assert len({c.describe() for c in tried}) == len(tried)
