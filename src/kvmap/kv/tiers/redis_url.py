"""A Redis URL that may hold a secret: resolved from the environment, parsed once.

``tiers(redis=env:NAME)`` reads the whole URL, password included, from variable NAME.
Passwords are often made with base64 and hold ``/``, ``?`` or ``#`` raw; a URL parser
then takes part of the password for the port, and its error quotes that part (issue 38:
``Port could not be cast to integer value as 'q8Zr2LmN5pKb7Wc'`` reached the index, the
report, the terminal). So the URL is split here by structure, once: the user info is
everything between ``scheme://`` and the *last* ``@`` (``kv/redact.py``'s rule), the
password is everything in it after the first ``:`` (percent-decoded, as redis-py does),
and only the rest -- scheme, host, port, database, options: no secret -- is given to
redis-py, with the user name and password as arguments. Any failure to parse is a
``ValueError`` with one fixed message that names where the URL came from and holds no
part of it. The password, and ``$KVMAP_REDIS_PASSWORD``, are remembered for the exact-
match scrub of every shown or stored text (``redact.remember_secret``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import unquote

from kvmap.kv.redact import remember_secret

PASSWORD_ENV = "KVMAP_REDIS_PASSWORD"


@dataclass(frozen=True)
class RedisURL:
    """``bare``: the URL without its user info (shown, and connected to);
    ``username`` and ``password`` beside it (never shown)."""

    bare: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def url_source(url: str) -> str:
    """Where a URL came from, for an error: ``redis=env:NAME`` or ``redis=<URL>``."""
    return f"redis={url}" if url.startswith("env:") else "redis=<the URL in the spec>"


def resolve_url(url: str) -> str:
    """``env:NAME`` -> the URL in variable NAME; any other URL unchanged. ValueError
    naming the variable when it is unset or empty."""
    if not url.startswith("env:"):
        return url
    name = url[4:]
    value = os.environ.get(name, "")
    if not value:
        raise ValueError(f"redis=env:{name}: environment variable {name!r} is not set")
    return value


def parse_url(url: str, source: str) -> RedisURL:
    """``url`` (resolved) split by structure and checked; ValueError with a fixed
    message naming ``source`` otherwise (see the module docstring)."""
    from redis.connection import parse_url as redis_parse_url
    scheme, sep, rest = url.partition("://")
    user_info, _, location = rest.rpartition("@")
    user, colon, password = user_info.partition(":")
    if colon:
        remember_secret(password)
        remember_secret(unquote(password))
    bare = scheme + sep + location
    try:
        if not sep or not location:
            raise ValueError("no location")
        redis_parse_url(bare)
    except Exception:   # noqa: BLE001 -- any parser error may quote a piece of the URL
        raise ValueError(
            f"{source}: not a valid redis://, rediss:// or unix:// URL (its text is not "
            f"shown: it may hold a password). Expected scheme://[[user]:password@]host"
            f"[:port][/db]; a password may hold any character") from None
    return RedisURL(bare, unquote(user) or None,
                    unquote(password) if colon and password else None)


def connection_options(url: str) -> tuple[RedisURL, dict]:
    """The parsed URL of ``url`` (``env:NAME`` resolved) and the arguments that carry
    its credentials to ``redis.Redis.from_url(parsed.bare, ...)``: its user name, and its
    password or else ``$KVMAP_REDIS_PASSWORD``."""
    parsed = parse_url(resolve_url(url), url_source(url))
    options = {"username": parsed.username} if parsed.username else {}
    password = parsed.password or os.environ.get(PASSWORD_ENV) or None
    if password:
        remember_secret(password)
        options["password"] = password
    return parsed, options


def remember_env_secrets(url: str) -> None:
    """Remember the password of ``env:NAME``'s URL and ``$KVMAP_REDIS_PASSWORD`` when
    they are set, for the scrub of what this process shows or stores (a bench parent
    never connects, but stores its cells' errors). Never raises: a bad URL is reported
    by the process that connects."""
    remember_secret(os.environ.get(PASSWORD_ENV))
    if url.startswith("env:") and os.environ.get(url[4:]):
        try:
            parse_url(os.environ[url[4:]], url_source(url))
        except ValueError:
            pass
