"""What a load request is sent to (``Endpoint``) and what it saw (``RawResult``): the two
types ``client.py`` and ``stream.py`` share, below both of them."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvmap.workloads.spec import WorkloadRequest

MAX_ERROR_CHARS = 500
APIS = ("completions", "chat")
ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "stream_error", "bad_stream",
               "disconnected", "no_output", "cancelled")


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send: the server, the API flavour and the request options.

    ``ignore_eos`` adds vLLM's ``ignore_eos`` extra so each request generates exactly
    ``max_tokens`` (turn it off for servers that reject unknown fields); ``include_usage``
    asks for the final usage chunk (``stream_options.include_usage``); ``stream=False``
    sends non-streaming requests (no TTFT or TBT then, only E2E and usage).
    """

    base_url: str
    model: str
    api: str = "completions"
    stream: bool = True
    include_usage: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.base_url!r} must start with http:// or https://")
        if self.api not in APIS:
            raise ValueError(f"api={self.api!r} is not one of {APIS}")
        for name in ("request_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r} must be a number of seconds > 0")

    @property
    def root(self) -> str:
        """The server root: ``http://h:p`` from ``http://h:p``, ``.../v1`` or ``.../v1/``."""
        url = self.base_url.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @property
    def url(self) -> str:
        return f"{self.root}/v1/{'completions' if self.api == 'completions' else 'chat/completions'}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, request: WorkloadRequest) -> dict:
        """The JSON body for ``request``."""
        body: dict = {"model": self.model, "max_tokens": request.max_tokens,
                      "temperature": self.temperature, "stream": self.stream}
        if self.api == "completions":
            body["prompt"] = request.prompt
        else:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        if self.stream and self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos and request.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass
class RawResult:
    """What one request saw; times are ``time.perf_counter()`` seconds.

    ``chunk_times_s`` holds one time per content chunk (see the module docstring);
    ``end_s`` is when the response was complete (``[DONE]`` read, or the JSON body of a
    non-streaming response). ``num_*_tokens`` come from the server's usage (None when it
    sent none).
    """

    request_id: str
    sent_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    output_text: str = ""
    finish_reason: str | None = None
    http_status: int | None = None
    error_kind: str | None = None
    error: str | None = None

    def fail(self, kind: str, message: str) -> None:
        """Record the first failure (a later one, say a cancel after a timeout, is ignored)."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"error kind {kind!r} is not one of {ERROR_KINDS}")
        if self.error_kind is None:
            self.error_kind, self.error = kind, message[:MAX_ERROR_CHARS]
