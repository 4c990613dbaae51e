"""Host names: which are this machine's own. A floor module (imports nothing of kvmap):
the bench's endpoints and ``kvmap serve``'s bind check share it."""
from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``[::1]``)."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
