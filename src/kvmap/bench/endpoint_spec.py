"""``endpoints:`` in a scenario: OpenAI-compatible servers measured as configurations.

    endpoints:
      - name: llamacpp-q8              # shown on the map like a KV configuration
        url: http://127.0.0.1:8081     # optional with launch (default 127.0.0.1:{port})
        model: smollm2                 # the served model name
        kv_label: "llama.cpp q8_0 K/V"
        kv_memory: 512MiB              # optional: what the engine was given (memory axis)
        launch: "llama-server -m {gguf} --port {port} --cache-type-k q8_0"
        metrics: /metrics              # scraped during each cell (null: not scraped)
        api_key_env: MY_SERVER_KEY     # optional: the key comes from this variable
        tokenizer: smollm2             # builds the prompts: smollm2 | bytes | dir | .gguf
        baseline: bf16                 # its accuracy baseline: another endpoint or a KV spec

``launch`` placeholders: ``{port}`` (a free port the runner picks; required), ``{gguf}``
(the endpoint's ``gguf:`` file, else the embedded SmolLM2 GGUF), ``{model}`` (the served
model name), ``{python}`` (this interpreter). A scenario is code (``scenario_trust``): a
``launch`` command runs only from a scenario file the user named, with the user's
environment. Hosts: a URL names a loopback host, or one listed in
``$KVMAP_ENDPOINT_HOSTS`` (comma-separated) -- a guard against sending load to a remote
server by accident when a scenario is copied, not a defence against the file. A key is
never written into the file, which is copied into the run directory: ``api_key`` and a
URL with a password are refused, ``api_key_env`` names the variable (any name; checked
set before any cell runs).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

ENDPOINT_KEYS = {"name", "url", "model", "kv_label", "kv_memory", "launch", "metrics",
                 "api_key_env", "tokenizer", "gguf", "baseline", "startup_timeout_s"}
PLACEHOLDERS = ("port", "gguf", "model", "python")
HOSTS_ENV = "KVMAP_ENDPOINT_HOSTS"
DEFAULT_STARTUP_TIMEOUT_S = 300.0


class EndpointUnavailable(RuntimeError):
    """What a cell asks of an endpoint that it does not offer (log-probabilities, say):
    the cell is stored as ``unavailable`` with this reason, not as a failure of the run."""


@dataclass(frozen=True)
class EndpointEntry:
    """One endpoint, validated. ``url`` may hold ``{port}`` until the runner launches it;
    ``launch`` is the command template (None: a server the user runs)."""

    name: str
    url: str
    model: str
    kv_label: str | None = None
    kv_memory_bytes: int | None = None
    launch: str | None = None
    metrics_path: str | None = "/metrics"
    api_key_env: str | None = None
    tokenizer: str = "smollm2"
    gguf: str | None = None
    baseline: str | None = None            # None: kvmap's own cell of the model's dtype
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S

    @property
    def label(self) -> str:
        """How the map names it: ``name (kv_label)``."""
        return f"{self.name} ({self.kv_label})" if self.kv_label else self.name

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def headers(self) -> dict[str, str]:
        """The request headers its key (if any) asks for."""
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def with_port(self, port: int) -> EndpointEntry:
        from dataclasses import replace
        return replace(self, url=self.url.replace("{port}", str(port)))


def user_hosts() -> set[str]:
    """The non-loopback hosts the user allows (``$KVMAP_ENDPOINT_HOSTS``)."""
    return {h.strip().lower() for h in os.environ.get(HOSTS_ENV, "").split(",") if h.strip()}


def placeholder_values(entry: EndpointEntry, port: int) -> dict[str, str]:
    """What each ``{name}`` of ``launch`` becomes (``gguf``: ValueError when none)."""
    import sys
    return {"port": str(port), "model": entry.model, "python": sys.executable,
            "gguf": entry.gguf or _embedded_gguf()}


def _embedded_gguf() -> str:
    from kvmap.model.loader import embedded_model_path
    return str(embedded_model_path())
