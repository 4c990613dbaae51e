"""Secrets by structure: credentials never enter a spec, and text that is shown or
stored is stripped of any that got in anyway.

A KV spec may name a Redis by URL (``tiers(redis=redis://host:6379/0)``). Its password
comes only from the environment -- ``redis=env:NAME`` (the whole URL in variable NAME)
or ``KVMAP_REDIS_PASSWORD`` (the password of a URL without one) -- and a URL written
into a spec with a password in it is refused when the spec is parsed
(:func:`check_no_password`), with an error that says how to pass it and never quotes it.
So no record, log, file name or fingerprint can hold one.

Every place that displays or stores a spec or a message that might quote one (error
messages, ``run.json``, the sqlite index, the Parquet ``kv`` column, cell ids, logs, the
HTML report, ``tune.json``, server labels) still passes it through :func:`redact_spec`
-- defence in depth, by structure rather than by a pattern of allowed characters:
a URL's user info is everything between ``scheme://`` and the *last* ``@`` that follows
it on the same line before the next ``scheme://``. Redis passwords may hold any
character (``@ { | ^ " < >``, spaces), so this may cut more than the user info of a
line that holds a URL and, later, an ``@`` of something else -- never less.

A password can also appear without its URL: a parser's error quoting a piece of it, a
library echoing it. So every password this process learns from the environment (the
Redis URL's, ``$KVMAP_REDIS_PASSWORD``: ``kv/tiers/redis_url.py``) is remembered
(:func:`remember_secret`) and :func:`redact_spec` also replaces each, and its
percent-encoded forms, by exact match with ``***``. Pieces of a password cannot be
matched; the one parser of secret URLs therefore never quotes the URL (issue 38).
"""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
MIN_SECRET_CHARS = 4          # shorter secrets would scrub common words; structure only
SCRUBBED = "***"
_secrets: set[str] = set()    # the known passwords and their encoded forms, this process


def remember_secret(secret: str | None) -> None:
    """Scrub ``secret`` (and its percent-encoded forms) by exact match from everything
    :func:`redact_spec` passes from now on. None, empty and shorter than
    ``MIN_SECRET_CHARS`` characters: ignored."""
    if secret and len(secret) >= MIN_SECRET_CHARS:
        _secrets.update({secret, quote(secret, safe=""), quote(secret)})


def scrub_secrets(text: str) -> str:
    """``text`` with every remembered secret replaced by ``***`` (longest first)."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, SCRUBBED)
    return text


def redact_url(url: str) -> str:
    """One URL without its user info: ``redis://u:p@ss@h:1/0`` -> ``redis://h:1/0``."""
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return head + sep + rest.rsplit("@", 1)[1]


def _redact_line(line: str) -> str:
    starts = [(m.start(), m.end()) for m in _SCHEME.finditer(line)]
    if not starts or "@" not in line:
        return line
    out, position = [], 0
    for i, (start, end) in enumerate(starts):
        segment_end = starts[i + 1][0] if i + 1 < len(starts) else len(line)
        at = line.rfind("@", end, segment_end)
        out.append(line[position:end])
        position = at + 1 if at >= 0 else end
    out.append(line[position:])
    return "".join(out)


def redact_spec(text: str) -> str:
    """``text`` with the user info (``user:password@``) removed from every URL in it,
    and every remembered secret scrubbed (:func:`remember_secret`).
    ``"tiers(redis=redis://u:pw@h:1/0)"`` -> ``"tiers(redis=redis://h:1/0)"``."""
    if _secrets:
        text = scrub_secrets(text)
    if "://" not in text or "@" not in text:
        return text
    return "\n".join(_redact_line(line) for line in text.split("\n"))


def redact_obj(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with :func:`redact_spec` applied to every
    string in it, keys included; other values unchanged."""
    if isinstance(value, str):
        return redact_spec(value)
    if isinstance(value, dict):
        return {redact_obj(k): redact_obj(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_obj(v) for v in value)
    return value


def has_password(text: str) -> bool:
    """Whether a URL in ``text`` has user info with a password (``user:pw@``, ``:pw@``;
    the user info as :func:`redact_spec` finds it)."""
    for line in text.split("\n"):
        starts = [(m.start(), m.end()) for m in _SCHEME.finditer(line)]
        for i, (_, end) in enumerate(starts):
            segment_end = starts[i + 1][0] if i + 1 < len(starts) else len(line)
            at = line.rfind("@", end, segment_end)
            if at >= 0 and ":" in line[end:at]:
                return True
    return False


def check_no_password(url: str, where: str, how: str) -> None:
    """ValueError when ``url`` carries a password; the message names ``where`` and says
    ``how`` to pass it instead, and quotes the URL only without its user info."""
    if has_password(url):
        raise ValueError(f"{where}: the URL {redact_url(url)!r} carries a password; a "
                         f"password written into a spec would be stored wherever the spec "
                         f"is (records, logs, run directories). {how}")
