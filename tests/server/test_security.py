"""API key (flag and environment), /health open, /metrics behind the key, the Host
check of a loopback bind, the warning of a public bind without a key, and the KV spec
shown without credentials."""
from __future__ import annotations

import logging

import pytest

from kvmap.kv.redact import redact_spec
from kvmap.server.security import allowed_hosts_for, host_name
from tests.server.conftest import start_server
from tests.server.test_api import assert_error

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed():
    s = start_server(api_key=KEY, allowed_hosts=("kvmap.internal",))
    yield s
    s.close()


def test_api_key_guards_everything_but_health(keyed):
    with keyed.client() as c:
        assert c.get("/health").status_code == 200
        for method, path, body in (("POST", "/v1/completions", {"prompt": "hi",
                                                               "max_tokens": 1}),
                                   ("GET", "/v1/models", None), ("GET", "/metrics", None),
                                   ("POST", "/tokenize", {"prompt": "hi"})):
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": KEY}):
                err = assert_error(c.request(method, path, json=body, headers=headers), 401)
                assert err["type"] == "AuthenticationError"
            ok = c.request(method, path, json=body,
                           headers={"Authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200, ok.text


def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVMAP_API_KEY", "from-env")
    s = start_server()
    try:
        with s.client() as c:
            assert_error(c.get("/v1/models"), 401)
            assert c.get("/v1/models", headers={"Authorization": "Bearer from-env"}
                         ).status_code == 200
    finally:
        s.close()


@pytest.mark.parametrize("host,ok", [("127.0.0.1:1234", True), ("localhost", True),
                                     ("LOCALHOST:80", True), ("[::1]:8000", True),
                                     ("kvmap.internal:9", True), ("evil.example", False),
                                     ("127.0.0.1.evil.example", False), ("", False)])
def test_host_check_on_a_loopback_bind(keyed, host, ok):
    with keyed.client() as c:
        r = c.get("/health", headers={"Host": host})
    if ok:
        assert r.status_code == 200
    else:
        assert_error(r, 403)


def test_host_names_and_public_binds():
    assert host_name("[::1]:8000") == "[::1]" and host_name("a.b:1") == "a.b"
    assert allowed_hosts_for("0.0.0.0") is None
    assert allowed_hosts_for("127.0.0.1", ("*",)) is None
    assert "localhost" in allowed_hosts_for("::1")


def test_public_bind_without_key_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="kvmap.server"):
        s = start_server(host="0.0.0.0")
    s.close()
    assert any("without an API key" in r.message for r in caplog.records)


def test_kv_spec_is_shown_without_credentials():
    spec = "bf16 + tiers(host=1MiB, redis=redis://user:PW-9@127.0.0.1:1/0)"
    assert redact_spec(spec) == "bf16 + tiers(host=1MiB, redis=redis://127.0.0.1:1/0)"
    assert redact_spec("redis://:pw@h") == "redis://h"
    assert redact_spec("redis://h:6379") == "redis://h:6379"
    from kvmap.server.engine_loop import EngineLoop
    from kvmap.config import EngineArgs
    from kvmap.server.engines import make_engine_factory
    from kvmap.server.metrics import ServerMetrics
    first, factory = make_engine_factory(EngineArgs(
        model="dummy:tiny", dtype="fp32", kv="fp32", num_blocks=64, block_size=4,
        device="cpu"))
    metrics = ServerMetrics("tiny", 512)
    EngineLoop(factory, spec, metrics, first_engine=first)     # the label it sets
    text = metrics.render().decode()
    assert "PW-9" not in text and "redis://127.0.0.1" in text
