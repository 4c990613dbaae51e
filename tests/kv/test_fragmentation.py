import pytest

from kvmap.kv.fragmentation import internal_waste


def test_waste_exact_hand_computed():
    # block 16, 1024 bytes per block (64 bytes per slot)
    # 17 tokens in 2 blocks -> 15 empty; 33 in 3 -> 15; 5 in 1 -> 11; 32 in 2 -> 0
    w = internal_waste([(2, 17), (3, 33), (1, 5), (2, 32)], 16, 1024)
    assert w.waste_slots == 15 + 15 + 11 + 0
    assert w.waste_bytes == 41 * 64
    assert w.resident_bytes == 8 * 1024
    assert w.share == pytest.approx(41 * 64 / 8192)


def test_waste_larger_blocks_waste_more():
    seqs8 = [(3, 17), (5, 33)]              # 7 + 7 empty of 8-slot blocks
    seqs64 = [(1, 17), (1, 33)]             # 47 + 31 empty of 64-slot blocks
    assert internal_waste(seqs8, 8, 800).waste_slots == 14
    assert internal_waste(seqs64, 64, 6400).waste_slots == 78
    assert internal_waste(seqs64, 64, 6400).waste_bytes == 78 * 100


def test_waste_empty_and_bad_input():
    assert internal_waste([], 16, 1024).share == 0.0
    with pytest.raises(ValueError, match="33 slots in 2 blocks"):
        internal_waste([(2, 33)], 16, 1024)
    with pytest.raises(ValueError, match="block_size=0"):
        internal_waste([(1, 1)], 0, 1024)


def test_block_size_not_dividing_context_is_named():
    from tests.conftest import make_tiny_llm
    with pytest.raises(ValueError, match=r"block_size=7 does not divide the model's context"):
        make_tiny_llm(block_size=7)


def test_block_size_larger_than_pool_budget_is_named():
    from tests.conftest import make_tiny_llm
    with pytest.raises(ValueError, match=r"too small for one block of 64 tokens"):
        make_tiny_llm(block_size=64, num_blocks=None, kv_memory=1024)
