"""The error body ``{"error": {"message", "type", "param", "code"}}`` and its statuses.

As in vLLM's OpenAI server: ``type`` names the HTTP error class, ``code`` is the status.
400 every invalid request (schema errors too -- FastAPI's 422 is overridden), 401 a
missing or wrong API key, 403 a Host header a loopback server does not answer (DNS
rebinding), 404 an unknown model, 413 a body over the size limit, 503 a full queue or a
dead or restarting engine, 504 a request past the server's request timeout, 500 only a
real internal fault (one request's, when a fault was pinned on it).

A 500 or 503 body never carries an exception's text (it may hold paths, a URL, a
prompt): it names an incident id, and the server log holds the exception under that id
(``incident``).
"""
from __future__ import annotations

import logging
import uuid
from http import HTTPStatus

from fastapi.responses import JSONResponse

from kvmap.server.protocol import ErrorResponse

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
          404: "NotFoundError", 413: "RequestEntityTooLarge", 500: "InternalServerError",
          503: "ServiceUnavailableError", 504: "TimeoutError"}


log = logging.getLogger("kvmap.server")


def incident(what: str, error: BaseException | str | None = None) -> str:
    """Log ``error`` (an exception, or a text the engine recorded) under a new incident
    id; returns ``what`` with that id, the message a client may see."""
    ident = uuid.uuid4().hex[:12]
    if isinstance(error, BaseException):
        log.error("incident %s: %s: %s: %s", ident, what, type(error).__name__, error,
                  exc_info=error)
    else:
        log.error("incident %s: %s: %s", ident, what, error)
    return f"{what} (incident {ident}; the server log has the details)"


class APIError(Exception):
    """Raised by handlers; turned into the error body by the app's exception handler."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "null"}


def _is_type_tag(part) -> bool:
    """pydantic puts the union member tried into ``loc`` (``str``, ``list[int]``, ...)."""
    text = str(part)
    return "[" in text or text in _TYPE_TAGS or text.startswith(("function-", "tagged-union"))


def describe_validation_errors(errors: list[dict]) -> tuple[str, str | None]:
    """pydantic/FastAPI validation errors -> (message, param) naming the first bad field
    and the value it got."""
    if not errors:
        return "invalid request", None
    def path(error) -> list[str]:
        return [str(p) for p in error.get("loc", ()) if p != "body" and not _is_type_tag(p)]

    # a union field fails once per member: a member whose type matched but whose value
    # failed a check ("value_error": a lone surrogate in a string) says most, then the
    # deepest failure ("prompt.1: greater than or equal to 0" beats "prompt: should be a
    # valid string")
    field = path(errors[0])[:1]
    first = max((e for e in errors if path(e)[:1] == field),
                key=lambda e: (e.get("type") == "value_error", len(path(e))))
    loc = path(first)
    param = ".".join(loc) or None
    where = f"{param}: " if param else ""
    message = f"{where}{first.get('msg', 'invalid value')}"
    if "input" in first and first.get("type") not in ("missing", "json_invalid"):
        got = repr(first["input"])
        message += f" (got {got[:80] + '...' if len(got) > 80 else got})"
    fields = {str(e.get("loc", ("", ""))[1:2]) for e in errors}
    if len(fields) > 1:
        message += f"; {len(fields) - 1} more fields are invalid"
    return message, param


# the error statuses documented on every route that takes a body (the fuzz test reads them)
ERROR_RESPONSES = {status: {"model": ErrorResponse}
                   for status in (400, 401, 403, 404, 413, 500, 503, 504)}
