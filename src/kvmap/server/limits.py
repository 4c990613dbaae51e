"""What one request may ask of the server, checked before any work is done on it.

Sizes are checked in the order their checks cost: the body (``BodyLimitMiddleware``,
before it is read), then every list in it and the prompt's characters (before the prompt
is tokenized, which runs on a worker thread), then tokens against the context. Stop
lists are bounded because every generated token is checked against them on the engine
thread (stop token ids as a set: one lookup a token); messages and content parts because
the chat template walks them; a ``cache_salt`` because it is hashed into every block.

Every list or free-size field of a request body is named in ``BODY_BOUNDS`` with what
bounds it (``tests/server/test_limits.py`` checks that no field is left out).
"""
from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
DEFAULT_MAX_STOP_STRINGS = 16
DEFAULT_MAX_STOP_CHARS = 256
DEFAULT_MAX_STOP_TOKEN_IDS = 64
DEFAULT_MAX_MESSAGES = 1024          # chat messages plus their content parts
DEFAULT_MAX_TOKENIZER_QUEUE = 64     # tokenizer jobs queued or running at once
MAX_CACHE_SALT_CHARS = 256
# a prompt of max_model_len tokens is rarely more than this many characters a token; a
# longer text cannot be a valid prompt in practice and is refused before tokenizing
DEFAULT_PROMPT_CHARS_PER_TOKEN = 32
DEFAULT_REQUEST_TIMEOUT_S = 600.0
# a request's header block must be complete this long after its first byte (or the
# connection's opening), else the connection is closed (``header_timeout.py``)
DEFAULT_HEADER_TIMEOUT_S = 10.0


# request-body field -> what bounds it (every list and free-size field; the test holds it)
BODY_BOUNDS = {
    "model": "compared with the served name; the body limit",
    "user": "ignored; the body limit",
    "stop": "max_stop_strings x max_stop_chars",
    "stop_token_ids": "max_stop_token_ids (a set on the engine thread)",
    "logit_bias": "refused unless empty",
    "stream_options": "two booleans",
    "cache_salt": f"1 to {MAX_CACHE_SALT_CHARS} characters",
    "prompt": "max_prompt_chars before tokenizing; token ids: the model's context; "
              "one prompt a request",
    "suffix": "refused unless empty",
    "messages": "max_messages (messages + content parts); max_prompt_chars of text",
    "tools": "refused unless empty",
    "response_format": "one type name; only text",
    "role": "counted in max_prompt_chars",
    "content": "counted in max_prompt_chars and max_messages",
    "name": "ignored; the body limit",
    "text": "counted in max_prompt_chars",
    "type": "one literal",
    "tokens": "the model's context (detokenize)",
}


def _setting(default, help: str):
    """A limit: its default and its command-line help (``kvmap.cli_options``)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask, declared once: ``ServerArgs`` (``args.py``) adds the
    server's own settings, ``kvmap serve``'s options come from these fields' defaults and
    help. ``max_tokens_limit``: a request without ``max_tokens`` gets at most this many.
    ``max_prompt_chars``: None -> ``DEFAULT_PROMPT_CHARS_PER_TOKEN`` x the model's
    context. ``request_timeout_s``: a request still running after this long is aborted
    with a 504 (None: no limit). ``max_concurrent_requests``: None -> the queue bound's
    default (``ServerArgs.limits``)."""

    max_body_bytes: int = _setting(DEFAULT_MAX_BODY_BYTES, "Largest request body")
    max_tokens_limit: int | None = _setting(None, "Most tokens one request may ask for")
    max_stop_strings: int = _setting(DEFAULT_MAX_STOP_STRINGS,
                                     "Most stop strings one request may give")
    max_stop_chars: int = _setting(DEFAULT_MAX_STOP_CHARS,
                                   "Longest stop string, in characters")
    max_prompt_chars: int | None = _setting(
        None, "Longest prompt in characters, refused before tokenizing (default: "
              f"{DEFAULT_PROMPT_CHARS_PER_TOKEN} x the model's context)")
    request_timeout_s: float | None = _setting(DEFAULT_REQUEST_TIMEOUT_S,
                                               "Seconds a request may take; then 504")
    max_stop_token_ids: int = _setting(DEFAULT_MAX_STOP_TOKEN_IDS,
                                       "Most stop token ids one request may give")
    max_messages: int = _setting(DEFAULT_MAX_MESSAGES, "Most chat messages plus content "
                                                       "parts one request may give")
    max_tokenizer_queue: int = _setting(DEFAULT_MAX_TOKENIZER_QUEUE,
                                        "Tokenizer jobs queued or running at once")
    max_concurrent_requests: int | None = _setting(
        None, "Requests served at once, more get 503; /health and /metrics are never "
              "refused, open sockets are not counted (default: max-queue + max-num-seqs "
              "+ a margin)")

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_stop_strings", "max_stop_chars",
                     "max_stop_token_ids", "max_messages", "max_tokenizer_queue"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        for name in ("max_tokens_limit", "max_prompt_chars", "max_concurrent_requests"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be an integer >= 1 (or None)")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s={self.request_timeout_s!r} must be > 0 "
                             f"(or None)")

    def prompt_chars(self, max_model_len: int) -> int:
        return self.max_prompt_chars or DEFAULT_PROMPT_CHARS_PER_TOKEN * max_model_len

    def check_lists(self, body) -> tuple[str, str] | None:
        """(param, why) for the first list of ``body`` (a protocol request) over its
        bound, else None: stop strings, stop token ids, messages and content parts, the
        cache salt."""
        bad = self.check_stop(getattr(body, "stop", None))
        ids = getattr(body, "stop_token_ids", None) or ()
        if bad is None and len(ids) > self.max_stop_token_ids:
            bad = "stop_token_ids", (f"stop_token_ids holds {len(ids)} ids; this server "
                                     f"takes at most {self.max_stop_token_ids} "
                                     f"(--max-stop-token-ids)")
        messages = getattr(body, "messages", None) or ()
        num_items = len(messages) + sum(len(m.content) for m in messages
                                        if isinstance(m.content, list))
        if bad is None and num_items > self.max_messages:
            bad = "messages", (f"messages hold {num_items} messages and content parts; "
                               f"this server takes at most {self.max_messages} "
                               f"(--max-messages)")
        salt = getattr(body, "cache_salt", None)
        if bad is None and salt is not None and not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
            bad = "cache_salt", (f"cache_salt holds {len(salt)} characters; it must hold "
                                 f"1 to {MAX_CACHE_SALT_CHARS}")
        return bad

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
