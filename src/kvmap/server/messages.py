"""What the engine thread answers a request with (commands to it: ``inbox``).

Answers (engine thread -> a request's queue) are a
``Delta`` per step, ``Accepted`` / ``Rejected`` for a submit, or an exception. The
exceptions name what the HTTP layer answers: ``EngineDeadError`` and ``QueueFullError``
503, ``RequestFailedError`` 500 (only that request failed), ``RequestTimeoutError`` 504.
"""
from __future__ import annotations

from dataclasses import dataclass


class EngineDeadError(RuntimeError):
    """The engine is not running (stopped, restarting, or given up after faults)."""


class QueueFullError(RuntimeError):
    """``--max-queue`` requests already wait."""


class RequestFailedError(RuntimeError):
    """This request hit a fault in the engine; it was aborted, the server goes on."""


class RequestTimeoutError(RuntimeError):
    """The request ran past the server's ``--request-timeout``; it was aborted."""


@dataclass(frozen=True)
class Delta:
    """New output of one request since the previous ``Delta``."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0          # all output tokens so far
    logprobs: object | None = None      # the last delta's ``ScoredTokens``, when asked


@dataclass(frozen=True)
class Accepted:
    """The engine took the request."""


@dataclass(frozen=True)
class Rejected:
    """The engine refused the request (``error`` is a ``ValueError`` -> 400, or a
    ``RequestFailedError`` -> 500)."""

    error: Exception


ACCEPTED = Accepted()
