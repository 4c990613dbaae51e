"""Credentials out of anything displayed or stored: ``scheme://user:pass@host`` becomes
``scheme://***@host`` wherever it appears in a string (a KV spec such as
``tiers(redis=redis://u:PW@h:6379)``, an error message, a log line)."""
from __future__ import annotations

import re

# scheme "://" then user info (no "/", "@" or whitespace) ending at the last "@" before
# the host; the user-info part is what carries a password
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]+)@")


def redact_url_userinfo(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
