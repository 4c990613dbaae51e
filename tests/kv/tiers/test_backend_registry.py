"""A tier backend is one file + one registration: a test double registered here, with no
other edit, is parsed by ``tiers(...)``, ordered among the levels, built by the tiered
store, priced by the cost model and listed by ``kvmap specs``."""
from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from kvmap.cli import app
from kvmap.kv.cache import PagedKVCache
from kvmap.kv.config import KVConfig
from kvmap.kv.spec import KVGeometry
from kvmap.kv.tiers import TIER_BACKENDS
from kvmap.kv.tiers.backend import tier_backend
from kvmap.kv.offload.cost import CostModel
from kvmap.kv.tiers.host import HostTier
from kvmap.kv.offload.store import TieredStore
from kvmap.model.shapes import get_shape

TINY = get_shape("tiny")


class TaggedTier(HostTier):
    """Host memory with one constructor option of its own, to see it arrive."""

    name = "tagged"

    def __init__(self, capacity_bytes: int, eviction="lru", on_evict=None,
                 tag: str | None = None) -> None:
        super().__init__(capacity_bytes, eviction, on_evict)
        self.tag = tag


@pytest.fixture
def tagged():
    tier_backend(order=15, latency_prior_s=3e-6, bandwidth_prior_bytes_per_s=7e9,
                 options={"tagged_tag": "tag"})(TaggedTier)
    yield TIER_BACKENDS["tagged"]
    TIER_BACKENDS.unregister("tagged")


def test_spec_parser_and_layout_take_a_registered_backend(tagged):
    layout = KVConfig.parse("tiers(disk=4MiB, tagged=2MiB, tagged_tag=blue, "
                            "tagged_codec=int8, host=1MiB)").tiers
    assert [lv.name for lv in layout.levels] == ["host", "tagged", "disk"]   # by order
    level = layout.levels[1]
    assert level.capacity_bytes == 2 * 2**20 and level.codec.name == "int8"
    assert level.backend_options == {"tag": "blue"}
    with pytest.raises(ValueError, match=re.escape("tagged_tag=blue is given without tagged=")):
        KVConfig.parse("tiers(host=1MiB, tagged_tag=blue)")
    with pytest.raises(ValueError, match="tagged"):          # the valid options name it
        KVConfig.parse("tiers(taged=1MiB)")


def test_store_builds_and_cost_model_prices_a_registered_backend(tagged):
    kv = PagedKVCache(KVConfig.parse("fp32").codec, KVGeometry.of(TINY, block_size=4), 8,
                      "cpu", torch.float32)
    store = TieredStore(KVConfig.parse("fp32+tiers(tagged=1MiB,tagged_tag=red)").tiers,
                        kv, TINY)
    try:
        tier = store.levels[0].tier
        assert isinstance(tier, TaggedTier) and tier.tag == "red"
        assert tier.capacity_bytes == 2**20
        link = store.cost.links["tagged"]
        assert (link.latency_s, link.bandwidth_bytes_per_s) == (3e-6, 7e9)
    finally:
        store.close()
    assert CostModel(TINY, ["tagged", "host"], 1e9).links["host"].latency_s == 20e-6


def test_cli_lists_a_registered_backend(tagged):
    result = CliRunner().invoke(app, ["specs", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["tier backend"] == ["host", "tagged", "disk", "redis"]


def test_an_unregistered_backend_is_gone_everywhere():
    assert "tagged" not in TIER_BACKENDS
    with pytest.raises(ValueError, match="no option 'tagged'"):
        KVConfig.parse("tiers(tagged=1MiB)")
    result = CliRunner().invoke(app, ["specs"])
    assert result.exit_code == 0 and "tier backend: host, disk, redis" in result.output
