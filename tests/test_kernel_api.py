"""npumem.kernel on the simulated AI cores: results, timelines, the sanitizer's faults (each
message names the core, the tile and the buffer), and what a fault does to its stream."""

import numpy as np
import pytest

import npumem
from npumem import kernel as K
from npumem.aicore import PROFILES, charged_bytes, current_profile, transfer_cycles
from npumem.errors import AsyncTaskError, FeatureNotSupportedError, InvalidParamError, KernelFault

TILE = 256


@K.kernel
def add_tiles(x, y, z, tile, buffers):
    """z = x + y, each block a contiguous share, `buffers` buffers per queue."""
    share = len(x) // K.get_block_num()
    first = K.get_block_idx() * share
    pipe = K.TPipe()
    qx, qy = K.TQue("VECIN", buffers, "in_x"), K.TQue("VECIN", buffers, "in_y")
    qz = K.TQue("VECOUT", buffers, "out_z")
    for queue in (qx, qy, qz):
        pipe.init_buffer(queue, buffers, tile * 4)
    for start in range(first, first + share, tile):
        a, b = qx.alloc_tensor(np.float32), qy.alloc_tensor(np.float32)
        K.data_copy(a, x[start:start + tile], tile)
        K.data_copy(b, y[start:start + tile], tile)
        qx.enque(a)
        qy.enque(b)
        a, b, c = qx.deque(), qy.deque(), qz.alloc_tensor(np.float32)
        K.add(c, a, b, tile)
        qz.enque(c)
        qx.free_tensor(a)
        qy.free_tensor(b)
        c = qz.deque()
        K.data_copy(z[start:start + tile], c, tile)
        qz.free_tensor(c)


@pytest.fixture
def stream(rt):
    s = npumem.create_stream()
    yield s
    npumem.destroy_stream(s) if not s.destroyed else None


def _inputs(n=8 * 4 * TILE):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    return x, y, npumem.from_numpy(x), npumem.from_numpy(y), npumem.empty((n,))


def test_a_tiled_add_kernel_computes_on_real_bytes_and_times_its_lanes(stream):
    x, y, X, Y, Z = _inputs()
    single = add_tiles[8, stream](X, Y, Z, TILE, 1)
    stream.synchronize()
    np.testing.assert_array_equal(Z.numpy(), x + y)
    double = add_tiles[8, stream](X, Y, Z, TILE, 2)
    stream.synchronize()
    np.testing.assert_array_equal(Z.numpy(), x + y)
    for launch in (single, double):
        assert launch.done.is_set() and launch.cores == 8
        lanes = launch.timeline.lane_cycles()
        assert lanes["MTE2"] > 0 and lanes["Vector"] > 0 and lanes["MTE3"] > 0
        assert {s.core for s in launch.timeline.slices} == set(range(8))
        assert {s.tile for s in launch.timeline.slices if s.core == 0} == {0, 1, 2, 3}
    # Double buffering lets the next tile's copy run under this tile's compute.
    assert single.timeline.overlap(0) == 0
    assert double.timeline.overlap(0) > 0.5
    assert double.timeline.makespan < single.timeline.makespan
    assert "utilisation" in double.timeline.summary()
    events = double.timeline.chrome_events("aicore")
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} >= {"core 0 MTE2", "core 7 MTE3"}


def test_more_blocks_than_cores_run_in_waves(stream, monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_CORES", "2")          # 2 cube cores, 4 vector cores
    x, y, X, Y, Z = _inputs()
    launch = add_tiles[8, stream](X, Y, Z, TILE, 2)
    stream.synchronize()
    np.testing.assert_array_equal(Z.numpy(), x + y)
    assert launch.cores == 4
    first = [s for s in launch.timeline.slices if s.block == 0]
    second = [s for s in launch.timeline.slices if s.block == 4]
    assert {s.core for s in second} == {0}
    assert min(s.start for s in second) >= max(s.end for s in first)


def test_profiles_name_their_sources_and_reject_bad_settings(monkeypatch):
    profile = current_profile()
    assert profile.name == "ascend910b" and profile.vector_cores == 48
    assert profile.buffers["UB"] == 192 * 1024
    for key in ("buffers", "cube_cores", "alignment", "MTE2.latency_cycles"):
        assert profile.sources[key]
    assert PROFILES["ascend910"].buffers["UB"] == 256 * 1024
    monkeypatch.setenv("NPUMEM_SIM_CORES", "lots")
    with pytest.raises(InvalidParamError, match="NPUMEM_SIM_CORES='lots'"):
        current_profile()
    monkeypatch.setenv("NPUMEM_SIM_CORES", "4")
    monkeypatch.setenv("NPUMEM_SIM_PROFILE", "gpu")
    with pytest.raises(InvalidParamError, match="ascend910, ascend910b"):
        current_profile()


def test_partial_bursts_are_charged_whole():
    engine = current_profile().engines["MTE2"]
    assert charged_bytes(engine, 256, 0) == 256
    assert charged_bytes(engine, 256, 32) == 512          # misaligned: one more burst
    assert charged_bytes(engine, 257, 0) == 512
    assert transfer_cycles(engine, 4096, 32) > transfer_cycles(engine, 4096, 0)


# --- the sanitizer --------------------------------------------------------------------------


@K.kernel
def too_big(x):
    pipe = K.TPipe()
    pipe.init_buffer(K.TQue("VECIN", 2, "in_x"), 2, 128 * 1024)


@K.kernel
def unaligned(x):
    pipe = K.TPipe()
    queue = K.TQue("VECIN", 1, "in_x")
    pipe.init_buffer(queue, 1, 1024)
    K.data_copy(queue.alloc_tensor(np.float32), x, 5)


@K.kernel
def outside(x):
    block_share = len(x)
    x[K.get_block_idx() * block_share:(K.get_block_idx() + 1) * block_share].get_value(0)


@K.kernel
def after_free(x):
    pipe = K.TPipe()
    queue = K.TQue("VECIN", 1, "in_x")
    pipe.init_buffer(queue, 1, 1024)
    tensor = queue.alloc_tensor(np.float32)
    queue.free_tensor(tensor)
    K.adds(tensor, tensor, 1.0, 8)


@K.kernel
def empty_deque(x):
    pipe = K.TPipe()
    queue = K.TQue("VECOUT", 2, "out_z")
    pipe.init_buffer(queue, 2, 1024)
    queue.deque()


@K.kernel
def twice(x):
    pipe = K.TPipe()
    queue = K.TQue("VECIN", 2, "in_x")
    pipe.init_buffer(queue, 2, 1024)
    tensor = queue.alloc_tensor(np.float32)
    queue.enque(tensor)
    queue.enque(tensor)


@pytest.mark.parametrize("bad, block_dim, expected", [
    (too_big, 1, r"core 0 \(block 0\), setup, before the first tile, buffer in_x \(VECIN, UB\): "
                 r"init_buffer\(2 x 131072 bytes\) needs 262144 bytes of the UB, but the UB "
                 r"holds 196608 bytes"),
    (unaligned, 1, r"core 0 \(block 0\), tile 0, buffer in_x \(VECIN, UB\): data_copy: unaligned "
                   r"data_copy of 20 bytes, not a whole number of 32-byte blocks"),
    (outside, 2, r"core 1 \(block 1\), setup, before the first tile: .* global access to bytes "
                 r"\[1024, 2048\) of argument x \(0x[0-9a-f]+, 1024 bytes\) is outside the "
                 r"kernel's arguments"),
    (after_free, 1, r"core 0 \(block 0\), tile 0, buffer in_x \(VECIN, UB\): adds: use after free_tensor"),
    (empty_deque, 1, r"core 0 \(block 0\), setup, before the first tile, buffer out_z \(VECOUT, UB\): deque on an empty queue"),
    (twice, 1, r"core 0 \(block 0\), tile 0, buffer in_x \(VECIN, UB\): enque of a tensor already in the queue"),
])
def test_the_sanitizer_names_core_tile_and_buffer(stream, bad, block_dim, expected):
    keep = np.arange(256, dtype=np.float32)
    X, kept = npumem.from_numpy(keep), npumem.from_numpy(keep * 2)
    launch = bad[block_dim, stream](X)
    with pytest.raises(AsyncTaskError, match=f"kernel {bad.name}: {expected}") as caught:
        stream.synchronize()
    assert caught.value.code == 507015 and launch.fault is not None
    # Device memory is intact and the stream works again.
    np.testing.assert_array_equal(X.numpy(), keep)
    np.testing.assert_array_equal(kept.numpy(), keep * 2)
    x, y, X2, Y2, Z2 = _inputs()
    add_tiles[8, stream](X2, Y2, Z2, TILE, 2)
    stream.synchronize()
    np.testing.assert_array_equal(Z2.numpy(), x + y)


@K.kernel
def raises(x):
    raise ValueError("bad tiling")


def test_a_kernel_that_raises_stops_its_stream_until_synchronize(stream):
    x, y, X, Y, _ = _inputs()
    Z = npumem.zeros((len(x),))
    raises[1, stream](X)
    skipped = add_tiles[8, stream](X, Y, Z, TILE, 2)   # queued behind the fault: skipped
    event = npumem.Event()
    event.record(stream)                            # sync points still run
    event.synchronize(timeout=10)
    with pytest.raises(AsyncTaskError, match=r"core 0 \(block 0\).*raised ValueError: bad "
                                             r"tiling.*1 later task\(s\) were skipped"):
        stream.synchronize()
    assert not Z.numpy().any()
    assert skipped.done.is_set() and "skipped" in str(skipped.fault) and not skipped.timeline.slices
    add_tiles[8, stream](X, Y, Z, TILE, 2)
    stream.synchronize()
    np.testing.assert_array_equal(Z.numpy(), x + y)


def test_launch_errors_are_clear(rt, stream):
    x, y, X, Y, Z = _inputs()
    with pytest.raises(InvalidParamError, match="block_dim must be 1..65535"):
        add_tiles[0, stream](X, Y, Z, TILE, 2)
    with pytest.raises(InvalidParamError, match=r"takes 5 argument\(s\)"):
        add_tiles[1, stream](X, Y)
    with pytest.raises(InvalidParamError, match="is launched, not called"):
        add_tiles(X, Y, Z, TILE, 2)
    with pytest.raises(KernelFault, match="only be called inside a @kernel"):
        K.get_block_idx()
    with pytest.raises(InvalidParamError, match="kind is one of vector, cube"):
        K.kernel(kind="scalar")(lambda x: None)


def test_kernels_need_the_simulator():
    pytest.importorskip("torch")
    from tests.conftest import torch_cpu_backend
    npumem.init(backend=torch_cpu_backend())
    npumem.set_device(0)
    x = npumem.from_numpy(np.zeros(64, np.float32))
    with pytest.raises(FeatureNotSupportedError, match="simulated device's AI cores"):
        raises[1](x)


@K.kernel(kind="cube")
def one_mmad(a, b, c, m, k, n):
    pipe = K.TPipe()
    qa1, qb1 = K.TQue("A1", 1, "a1"), K.TQue("B1", 1, "b1")
    qa2, qb2, qc = K.TQue("A2", 1, "a2"), K.TQue("B2", 1, "b2"), K.TQue("CO1", 1, "c")
    for queue, nbytes in ((qa1, m * k * 4), (qb1, k * n * 4), (qa2, m * k * 4),
                          (qb2, k * n * 4), (qc, m * n * 4)):
        pipe.init_buffer(queue, 1, nbytes)
    la, lb = qa1.alloc_tensor(np.float32), qb1.alloc_tensor(np.float32)
    K.data_copy(la, a, m * k)
    K.data_copy(lb, b, k * n)
    za, zb, acc = qa2.alloc_tensor(np.float32), qb2.alloc_tensor(np.float32), qc.alloc_tensor(np.float32)
    K.data_copy(za, la, m * k)
    K.data_copy(zb, lb, k * n)
    K.mmad(acc, za, zb, m, k, n)
    K.data_copy(c, acc, m * n)


def test_a_cube_kernel_goes_through_l1_and_l0(stream):
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 3, (32, 64)).astype(np.float32)
    b = rng.integers(-3, 3, (64, 16)).astype(np.float32)
    A, B, C = npumem.from_numpy(a), npumem.from_numpy(b), npumem.empty((32, 16))
    launch = one_mmad[1, stream](A, B, C, 32, 64, 16)
    stream.synchronize()
    np.testing.assert_array_equal(C.numpy(), a @ b)
    lanes = launch.timeline.lane_cycles()
    assert lanes["MTE1"] > 0 and lanes["Cube"] > 0 and launch.cores == 1


# --- load balancing and the benches that measure it ------------------------------------------


def test_partition_policies_cover_every_item_once():
    from npumem.aicore.balance import partition

    costs = [16, 1, 1, 1, 1, 1, 1, 9, 1, 1, 8, 1]
    for policy in ("uniform", "balanced"):
        shares = partition(costs, 4, policy)
        assert sorted(i for share in shares for i in share) == list(range(len(costs)))
    loads = [sum(costs[i] for i in share) for share in partition(costs, 4, "balanced")]
    uniform = [sum(costs[i] for i in share) for share in partition(costs, 4, "uniform")]
    assert max(loads) == 16 < max(uniform)
    with pytest.raises(InvalidParamError, match="choose uniform or balanced"):
        partition(costs, 4, "random")
    with pytest.raises(InvalidParamError, match="need at least one"):
        partition(costs, 0)


def _bench(name, *args):
    import json
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / name), "--json", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NPUMEM_SANITIZE": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_multicore_bench_prints_rows_where_balancing_wins():
    rows = _bench("multicore.py", "--items", "96")
    assert [row["cores"] for row in rows] == [8, 16, 32, 64]
    assert all(0 < row["uniform"] < row["balanced"] <= 1 for row in rows)


def test_the_sparse_bench_prints_a_row_per_density_and_pattern():
    rows = _bench("sparse.py", "--size", "256", "--repeat", "1")
    assert [(row["pattern"], row["density"]) for row in rows] == \
        [(p, d) for p in ("tiles", "scattered") for d in (0.05, 0.1, 0.2, 0.3)]
    assert {row["strategy"] for row in rows if row["pattern"] == "tiles" and row["density"] <= 0.1} \
        == {"block"}                       # (at 256 x 256, a 30% draw of 64 tiles may pass 30%)
    assert all(row["speedup"] > 0 for row in rows)
