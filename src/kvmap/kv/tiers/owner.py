"""Who owns a private tier namespace: a Redis key prefix or a disk directory carries the
pid of the process that made it, so a later process can tell a live owner from a dead
one (killed cells run no clean-up) and remove only what the dead left behind."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
