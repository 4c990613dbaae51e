import pytest

from kvmap.kv.pool import BlockPool
from kvmap.kv.prefix import block_hashes, prefix_salt


def test_allocate_free_refcounts():
    pool = BlockPool(8, 4)
    a = pool.allocate(3)
    b = pool.allocate(2)
    assert pool.num_free == 3 and len(set(a + b)) == 5
    pool.check_integrity([a, b])
    pool.free(a)
    assert pool.num_free == 6
    pool.check_integrity([b])
    with pytest.raises(MemoryError):
        pool.allocate(7)
    with pytest.raises(ValueError, match="refcount"):
        pool.free(a)


def test_prefix_lookup_and_eviction_order():
    pool = BlockPool(4, 2)
    salt = prefix_salt("m", "bf16", "bf16")
    hs = block_hashes([1, 2, 3, 4, 5], 2, salt)
    assert len(hs) == 2                                   # only full blocks
    blocks = pool.allocate(2)
    for b, h in zip(blocks, hs):
        pool.register_hash(b, h)
    pool.free(blocks)
    found = pool.lookup(hs)
    assert found == blocks and pool.num_prefix_hits == 2
    pool.check_integrity([found])
    pool.free(found)
    # allocating every block evicts the cached hashes
    pool.allocate(4)
    assert pool.lookup(hs) == [] and pool.hash_to_block == {}


def test_hash_chain_depends_on_prefix_and_salt():
    salt = prefix_salt("m", "bf16", "bf16")
    a = block_hashes([1, 2, 3, 4], 2, salt)
    b = block_hashes([9, 2, 3, 4], 2, salt)
    c = block_hashes([1, 2, 3, 4], 2, prefix_salt("m", "int8", "bf16"))
    assert a[0] != b[0] and a[1] != b[1]                  # block 1 differs through the chain
    assert a[0] != c[0]
    assert block_hashes([1, 2, 3, 4], 2, salt, start_block=1, parent=a[0]) == a[1:]
