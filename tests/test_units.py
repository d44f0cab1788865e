import pytest
from hypothesis import given, strategies as st

from npumem.units import GiB, KiB, MiB, align_up, carve, carve_size, format_size, parse_size


@pytest.mark.parametrize("text, expected", [
    ("16GiB", 16 * GiB), ("512 MiB", 512 * MiB), ("4k", 4 * KiB), ("100", 100), ("1.5G", GiB * 3 // 2),
    ("2 tib", 2 << 40), ("2 t", 2 << 40), (7, 7),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "12 parsecs", "-5", "1e9"])
def test_parse_size_rejects_garbage_with_a_hint(bad):
    with pytest.raises(ValueError, match="16GiB"):
        parse_size(bad)


@pytest.mark.parametrize("text, binary", [("2 tb", "2TiB"), ("16GB", "16GiB"), ("3 kb", "3KiB")])
def test_decimal_looking_units_are_refused_as_ambiguous(text, binary):
    with pytest.raises(ValueError, match=f"ambiguous.*write {binary}"):
        parse_size(text)


def test_format_size():
    assert format_size(0) == "0 B"
    assert format_size(1536) == "1.50 KiB"
    assert format_size(32 * GiB) == "32.00 GiB"


def test_align_up_matches_the_cann_formula():
    # ALIGN_UP(len, k) = ((len - 1) / k + 1) * k
    for length in range(1, 300):
        assert align_up(length, 32) == ((length - 1) // 32 + 1) * 32
    assert carve_size(1) == 64 and carve_size(32) == 64 and carve_size(33) == 96


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=30), st.sampled_from([64, 128]))
def test_carved_pieces_follow_the_rules_and_never_overlap(lengths, start_align):
    offsets, total = carve(lengths, start_align)
    ends = [o + carve_size(n) for o, n in zip(offsets, lengths)]
    assert all(o % start_align == 0 for o in offsets)
    assert all(e <= nxt for e, nxt in zip(ends, offsets[1:]))
    assert total == ends[-1]
    assert total - sum(carve_size(n) for n in lengths) < start_align * len(lengths)


def test_carve_rejects_empty_pieces():
    with pytest.raises(ValueError, match="positive"):
        carve([10, 0])
