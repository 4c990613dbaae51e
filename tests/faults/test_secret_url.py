"""A secret Redis URL parsed once, by structure, and never quoted (issue 38): passwords
made with base64 hold ``/``, ``?`` and ``#`` raw, and a URL parser took a piece of one
for the port and quoted it (``Port could not be cast to integer value as 'q8Zr...'``)
into the index, the report, the terminal and ``kvmap serve``'s error. Here such
passwords connect (raw or percent-encoded); a URL that cannot be parsed is refused with
one fixed message that holds no part of it; and every known password is scrubbed by
exact match from whatever ``redact_spec`` passes."""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
from typer.testing import CliRunner

from kvmap.kv.redact import redact_spec
from kvmap.kv.tiers import serde
from kvmap.kv.tiers.redis_url import PASSWORD_ENV, connection_options, parse_url
from tests.faults.test_secret_never_stored import app, scenario

URL_ENV = "KVMAP_TEST_SECRET_URL_38"
PASSWORDS = ["q8Zr/2LmN5pKb7Wc", "a?b=c&d+e/f==", "x#frag/y?z", 'Sup3r@{|^"<> Secret-4711',
             'q8/Zr?2L#mN@{|^"<> 5pKb%zz']


def forms(password: str) -> list[str]:
    """The password, its encodings, and every piece of 6 characters of it."""
    pieces = [password[i:i + 6] for i in range(len(password) - 5)]
    return [password, quote(password, safe=""), quote(password), *pieces]


def assert_nowhere(password: str, root: Path | None, *outputs: str) -> None:
    for p in (root.rglob("*") if root is not None else ()):
        if p.is_file():
            data = p.read_bytes()
            assert not any(f.encode() in data for f in forms(password)), p
    for out in outputs:
        assert not any(f in out for f in forms(password)), out


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("encode", [False, True])
def test_a_password_with_any_character_is_split_off_by_structure(password, encode):
    given = quote(password, safe="") if encode else password
    parsed = parse_url(f"redis://user:{given}@127.0.0.1:6391/2", "redis=env:X")
    assert parsed.bare == "redis://127.0.0.1:6391/2" and parsed.username == "user"
    assert parsed.password == password or (not encode and "%zz" in password)
    assert password not in repr(parsed)
    assert parse_url("unix://:pw@/tmp/r.sock?db=1", "x").bare == "unix:///tmp/r.sock?db=1"


@pytest.mark.parametrize("password", PASSWORDS)
def test_an_unparsable_url_gets_a_fixed_message_with_no_part_of_it(password, monkeypatch):
    piece = password.replace("@", "")[:6]
    bad = [f"redis://:{password}@127.0.0.1:{piece}/0",           # a port of its pieces
           f"redis://:{password}@127.0.0.1:99999999/0", f"http://:{password}@h:1/0",
           f"redis://:{password}@"]
    messages = set()
    for url in bad:
        monkeypatch.setenv(URL_ENV, url)
        with pytest.raises(ValueError) as info:
            connection_options(f"env:{URL_ENV}")
        message = str(info.value)
        assert_nowhere(password, None, message)
        assert "127.0.0.1" not in message and f"redis=env:{URL_ENV}" in message
        messages.add(message)
    assert len(messages) == 1                   # one fixed message, whatever the URL


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_known_password_is_scrubbed_by_exact_match(password, monkeypatch):
    monkeypatch.setenv(URL_ENV, f"redis://:{password}@127.0.0.1:6391/0")
    connection_options(f"env:{URL_ENV}")
    monkeypatch.setenv(PASSWORD_ENV, password[::-1] + "-env")
    connection_options("redis://127.0.0.1:6391/0")
    for text in (f"AUTH failed for {password}", f"echo {quote(password, safe='')}!",
                 f"{password[::-1]}-env in a log line", f"x {quote(password)} y"):
        out = redact_spec(text)
        assert password not in out and quote(password, safe="") not in out
        assert password[::-1] + "-env" not in out and "***" in out


FRAME = serde.encode_block([{"k": torch.ones(2, 2)}])


@pytest.mark.redis
@pytest.mark.parametrize("encode", [False, True])
def test_such_passwords_log_in(redis_server, monkeypatch, encode):
    import redis
    from kvmap.kv.tiers.redis_tier import RedisTier
    client = redis.Redis(port=redis_server.port)
    for password in PASSWORDS:
        client.config_set("requirepass", password)
        client = redis.Redis(port=redis_server.port, password=password)
        given = quote(password, safe="") if encode else password
        if "%zz" in password and not encode:
            continue                             # a raw '%' is read as an escape
        monkeypatch.setenv(URL_ENV, f"redis://:{given}@127.0.0.1:{redis_server.port}/0")
        tier = RedisTier(1 << 20, url=f"env:{URL_ENV}")
        assert tier.put("k", FRAME) and tier.get("k") == FRAME, password
        assert tier.stats.num_errors == 0 and password not in tier.url
        tier.close()


def run_bench(tmp_path, name: str) -> tuple[object, Path]:
    path = scenario(tmp_path, f"fp32+tiers(redis=env:{URL_ENV},fetch=always)")
    out = tmp_path / name
    result = CliRunner().invoke(app(), ["bench", str(path), "--out", str(out), "--json"])
    return result, out


@pytest.mark.redis
def test_a_bench_run_stores_no_piece_of_a_slash_query_hash_password(
        redis_server, tmp_path, monkeypatch):
    """The issue's repro: a raw ``/ ? #`` password in ``env:``. It logs in, and neither
    it nor a piece of it is in any file or output; a URL that cannot be parsed fails its
    cells with the fixed message, and again no piece of it is anywhere."""
    import redis
    password = PASSWORDS[-1].replace("%zz", "")
    redis.Redis(port=redis_server.port).config_set("requirepass", password)
    monkeypatch.setenv(URL_ENV, f"redis://:{password}@127.0.0.1:{redis_server.port}/0")
    result, out = run_bench(tmp_path, "ok")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout.strip().splitlines()[-1])["cells"]
    assert row["metrics"]["tiers"]["redis"]["num_puts"] > 0      # it logged in
    assert row["metrics"]["tier_errors"] == 0
    assert_nowhere(password, out, result.output)

    monkeypatch.setenv(URL_ENV, f"redis://:{password}@127.0.0.1:{password[-6:]}/0")
    result, out = run_bench(tmp_path, "bad")
    assert "not a valid redis://" in result.output
    assert_nowhere(password, out, result.output)


def test_kvmap_serve_reports_a_bad_url_without_it(monkeypatch):
    from tests.server.conftest import build_tiny
    password = PASSWORDS[0]
    monkeypatch.setenv(URL_ENV, f"redis://:{password}@127.0.0.1:{password[:6]}/0")
    with pytest.raises(ValueError) as info:
        build_tiny(kv=f"fp32+tiers(redis=env:{URL_ENV})")
    assert "not a valid redis://" in str(info.value)
    assert_nowhere(password, None, str(info.value))
