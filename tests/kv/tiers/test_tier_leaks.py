"""Leaked storage and credentials: TTLs, clean-up on exit and on the next start, env URLs,
the tmpfs warning."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from kvmap.kv.tiers import disk as disk_module
from kvmap.kv.tiers.disk import DiskTier, TmpfsWarning, private_directory
from kvmap.kv.tiers.serde import encode_block

FRAME = encode_block([{"k": torch.arange(64, dtype=torch.uint8)}])


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_dead_processes_disk_directories_are_swept_live_ones_kept(tmp_path):
    """Only pids of this pid space are judged: a directory of a process in another pid
    namespace (a container sharing the directory and the host name) stays, whatever
    its pid looks like here."""
    from kvmap.kv.tiers.owner import pid_space
    space, pid = pid_space(), dead_pid()
    dead = tmp_path / f"kvmap-disk-{space}-{pid}-abc"
    live = tmp_path / f"kvmap-disk-{space}-{os.getppid()}-def"
    elsewhere = tmp_path / f"kvmap-disk-{'0' * 12}-{pid}-ghi"     # dead here, not there
    other = tmp_path / "kvmap-disk-notapid"
    for d in (dead, live, elsewhere, other):
        d.mkdir()
        (d / "x.kvb").write_bytes(b"1")
    mine = private_directory(tmp_path)
    assert not dead.exists() and live.exists() and elsewhere.exists() and other.exists()
    assert mine.name.startswith(f"kvmap-disk-{space}-{os.getpid()}-")


def test_disk_tier_on_tmpfs_warns(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_module, "filesystem_type", lambda path: "tmpfs")
    with pytest.warns(TmpfsWarning, match="RAM"):
        DiskTier(1 << 20, directory=tmp_path).close()
    monkeypatch.setattr(disk_module, "filesystem_type", lambda path: "ext4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DiskTier(1 << 20, directory=tmp_path).close()


def test_filesystem_type_reads_proc_mounts():
    assert disk_module.filesystem_type("/") not in (None, "")


_CHILD = """
import os, signal, sys, torch
from kvmap.kv.tiers.{mod} import {cls}
from kvmap.kv.tiers.serde import encode_block
tier = {make}
assert tier.put("a", encode_block([{{"k": torch.zeros(8, dtype=torch.uint8)}}]))
print({where}, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def run_child(how: str, mod: str, cls: str, make: str, where: str) -> str:
    code = _CHILD.format(mod=mod, cls=cls, make=make, where=where)
    out = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True,
                         timeout=60, env={**os.environ,
                                          "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip(), out.stderr
    return out.stdout.strip()


def test_disk_directory_removed_at_exit_and_after_a_kill_on_next_start(tmp_path):
    make = f"DiskTier(1 << 20, directory=__import__('kvmap.kv.tiers.disk').kv.tiers.disk" \
           f".private_directory({str(tmp_path)!r}))"
    # a tier given a directory leaves the (empty) directory; the sweep takes it later
    clean = run_child("exit", "disk", "DiskTier", make, "tier.directory")
    assert not list(__import__("pathlib").Path(clean).glob("*.kvb"))
    killed = run_child("kill", "disk", "DiskTier", make, "tier.directory")
    assert list(__import__("pathlib").Path(killed).glob("*.kvb"))
    private_directory(tmp_path)
    assert not os.path.exists(killed) and not os.path.exists(clean)


@pytest.mark.redis
def test_redis_keys_have_a_ttl_and_env_urls_resolve(redis_server, monkeypatch):
    from kvmap.kv.tiers.redis_tier import RedisTier
    monkeypatch.setenv("KVMAP_TEST_REDIS", redis_server.url)
    tier = RedisTier(1 << 20, url="env:KVMAP_TEST_REDIS", key_ttl_s=600)
    try:
        assert tier.put("a", FRAME) and tier.get("a") == FRAME
        assert 0 < tier.client.ttl(tier._rkey("a")) <= 600
        assert tier.key_prefix.startswith(f"kvmap:".encode())
        assert f":{os.getpid()}:".encode() in tier.key_prefix
    finally:
        tier.close()
    with pytest.raises(ValueError, match="KVMAP_UNSET_VAR"):
        RedisTier(1 << 20, url="env:KVMAP_UNSET_VAR")


@pytest.mark.redis
def test_redis_password_from_the_environment(redis_server, monkeypatch):
    import redis
    from kvmap.kv.tiers.redis_tier import RedisTier
    redis.Redis(port=redis_server.port).config_set("requirepass", "envpw-123")
    monkeypatch.setenv("KVMAP_REDIS_PASSWORD", "envpw-123")
    tier = RedisTier(1 << 20, url=redis_server.url)
    try:
        assert tier.put("a", FRAME) and tier.get("a") == FRAME and not tier.stats.errors
        assert "envpw" not in tier.url and "envpw" not in repr(tier)
    finally:
        tier.close()
    monkeypatch.setenv("KVMAP_TEST_REDIS", f"redis://:envpw-123@127.0.0.1:{redis_server.port}/0")
    monkeypatch.delenv("KVMAP_REDIS_PASSWORD")
    tier = RedisTier(1 << 20, url="env:KVMAP_TEST_REDIS")
    try:
        assert tier.put("a", FRAME) and tier.url == redis_server.url
    finally:
        tier.close()


@pytest.mark.redis
def test_redis_namespace_deleted_at_exit_and_after_a_kill_on_next_start(redis_server):
    import redis
    client = redis.Redis.from_url(redis_server.url)
    make = f"RedisTier(1 << 20, url={redis_server.url!r})"
    run_child("exit", "redis_tier", "RedisTier", make, "tier.key_prefix.decode()")
    assert client.dbsize() == 0                                  # atexit deleted it
    prefix = run_child("kill", "redis_tier", "RedisTier", make, "tier.key_prefix.decode()")
    assert client.dbsize() == 1 and client.ttl(prefix.encode() + b"s:a") > 0
    live = prefix.split(":")
    live[2] = str(os.getpid())                                   # a live process's key
    client.set(":".join(live).encode() + b"s:b", b"x")
    client.set(b"shared:ns:s:c", b"x")                           # not a private namespace
    # the same host name in another pid namespace (a container on the host network,
    # named by host and pid alone): its pid is dead here, but not ours to judge
    import re
    import socket
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64]
    twin = f"kvmap:{host}:{prefix.split(':')[2]}:x:".encode() + b"s:d"
    client.set(twin, b"x")
    from kvmap.kv.tiers.redis_tier import RedisTier
    tier = RedisTier(1 << 20, url=redis_server.url)
    try:
        tier.get("nothing")         # no I/O for an unknown key ...
        tier.put("z", FRAME)        # ... the first command sweeps
        keys = sorted(client.keys())
        assert prefix.encode() + b"s:a" not in keys
        assert b"shared:ns:s:c" in keys and ":".join(live).encode() + b"s:b" in keys
        assert twin in keys
    finally:
        tier.close()
