"""A bench backend is one class with ``@BENCH_BACKENDS.register``: ``make_backend`` (and so
``kvmap bench --backend``) finds a registered test double with no other edit."""
from __future__ import annotations

import pytest

from kvmap.bench.backends import BENCH_BACKENDS, CellBackend, LocalBackend, make_backend


class Joiner(CellBackend):
    name = "joiner"
    takes_address = True

    def __init__(self, address: str | None = None):
        self.address = address


@pytest.fixture
def joiner():
    BENCH_BACKENDS.register(Joiner)
    yield Joiner
    BENCH_BACKENDS.unregister("joiner")


def test_make_backend_finds_a_registered_backend(joiner):
    backend = make_backend("joiner", "10.0.0.1:1")
    assert isinstance(backend, Joiner) and backend.address == "10.0.0.1:1"
    with pytest.raises(ValueError, match="needs --backend ray or joiner"):
        make_backend("local", "10.0.0.1:1")
    assert isinstance(make_backend("local"), LocalBackend)


def test_unknown_backend_lists_the_registered_ones():
    assert list(BENCH_BACKENDS) == ["local", "ray"]
    with pytest.raises(ValueError, match="unknown backend 'joiner'; valid backends: local, ray"):
        make_backend("joiner")
