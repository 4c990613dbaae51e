"""What one request may ask of the server, checked before any work is done on it.

Sizes are checked in the order their checks cost: the body (``BodyLimitMiddleware``,
before it is read), then the prompt's characters and the stop list (before the prompt is
tokenized, which runs on a worker thread), then tokens against the context. A stop list
is bounded because every generated token is checked against it on the engine thread.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
DEFAULT_MAX_STOP_STRINGS = 16
DEFAULT_MAX_STOP_CHARS = 256
# a prompt of max_model_len tokens is rarely more than this many characters a token; a
# longer text cannot be a valid prompt in practice and is refused before tokenizing
DEFAULT_PROMPT_CHARS_PER_TOKEN = 32
DEFAULT_REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ServerLimits:
    """``max_tokens_limit``: the most tokens one request may ask for (more is a 400); a
    request without ``max_tokens`` gets at most this many. ``max_prompt_chars``: None ->
    ``DEFAULT_PROMPT_CHARS_PER_TOKEN`` x the model's context. ``request_timeout_s``: a
    request still running after this long is aborted with a 504 (None: no limit)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_tokens_limit: int | None = None
    max_stop_strings: int = DEFAULT_MAX_STOP_STRINGS
    max_stop_chars: int = DEFAULT_MAX_STOP_CHARS
    max_prompt_chars: int | None = None
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_stop_strings", "max_stop_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        for name in ("max_tokens_limit", "max_prompt_chars"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be an integer >= 1 (or None)")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s={self.request_timeout_s!r} must be > 0 "
                             f"(or None)")

    def prompt_chars(self, max_model_len: int) -> int:
        return self.max_prompt_chars or DEFAULT_PROMPT_CHARS_PER_TOKEN * max_model_len

    def check_stop(self, stop: str | list[str] | None) -> tuple[str, str] | None:
        """(param, why) when the stop list is over the bounds, else None."""
        strings = [stop] if isinstance(stop, str) else list(stop or [])
        if len(strings) > self.max_stop_strings:
            return "stop", (f"stop holds {len(strings)} strings; this server takes at most "
                            f"{self.max_stop_strings} (--max-stop-strings)")
        longest = max((len(s) for s in strings), default=0)
        if longest > self.max_stop_chars:
            return "stop", (f"a stop string of {longest} characters is longer than this "
                            f"server's limit of {self.max_stop_chars} (--max-stop-chars)")
        return None
