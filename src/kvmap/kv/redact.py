"""Strip credentials from text that is shown or stored: ``redact_spec``.

A KV spec may name a Redis by URL (``tiers(redis=redis://user:PW@host:6379/0)``). The
preferred way to give a password is the environment (``redis=env:NAME``, or
``KVMAP_REDIS_PASSWORD``; see ``kv/tiers/redis_tier.py``), so that the spec holds none.
A spec that still carries one is accepted -- the tier needs it to connect -- but every
place that displays or stores a spec (error messages, ``run.json``, the sqlite index,
the Parquet ``kv`` column, cell ids, logs, the HTML report, server labels) passes it
through :func:`redact_spec` first, which removes the ``user:password@`` part of every
URL in the text and leaves everything else as it was.
"""
from __future__ import annotations

import re

# scheme://userinfo@ -- userinfo as RFC 3986 allows it (unreserved, %-escapes,
# sub-delims, ':'), so the match never runs past the end of a URL into other text
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[A-Za-z0-9\-._~%!$&'()*+,;=:]*@")


def redact_spec(text: str) -> str:
    """``text`` with the user info (``user:password@``) removed from every URL in it.
    ``"tiers(redis=redis://u:pw@h:1/0)"`` -> ``"tiers(redis=redis://h:1/0)"``."""
    return _USERINFO.sub(r"\1", text)


def redact_obj(value):
    """A JSON-like value (dicts, lists, strings) with :func:`redact_spec` applied to every
    string in it, keys included; other values unchanged."""
    if isinstance(value, str):
        return redact_spec(value)
    if isinstance(value, dict):
        return {redact_obj(k): redact_obj(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_obj(v) for v in value)
    return value
