"""What an endpoint cell -- a workload (``endpoint_workload``) or an accuracy task
(``endpoint_tasks``) over HTTP -- asks of the server first, and how it addresses it.

Import direction: the bench uses ``kvmap.loadgen``'s transport -- ``endpoint``,
``client``, ``stream``, ``runner``, ``schedule``, ``results``, ``server_metrics``,
``prompts`` -- which import nothing of the bench (only ``loadgen.sweep`` and
``loadgen.command`` sit above it; ``tests/bench/test_endpoint_spec.py`` holds that).
"""
from __future__ import annotations

from kvmap.bench.endpoint_spec import EndpointEntry
from kvmap.kv.redact import redact_spec


def endpoint_info(entry: EndpointEntry) -> dict:
    """What a record says about its endpoint (``metrics.endpoint``)."""
    return {"name": entry.name, "url": redact_spec(entry.url), "model": entry.model,
            "kv_label": entry.kv_label, "label": entry.label,
            "kv_memory_bytes": entry.kv_memory_bytes, "launched": entry.launch is not None,
            "baseline": entry.baseline}


def http_endpoint(entry: EndpointEntry, *, stream: bool = True, ignore_eos: bool = True,
                  request_timeout_s: float = 300.0):
    from kvmap.loadgen.endpoint import Endpoint
    return Endpoint(entry.url, entry.model, api="completions", stream=stream,
                    ignore_eos=ignore_eos, temperature=0.0, api_key=entry.api_key(),
                    request_timeout_s=request_timeout_s)


async def check_served(session, entry: EndpointEntry) -> None:
    """``RuntimeError`` naming the endpoint when it is unreachable or does not list the
    model in ``/v1/models`` (a server without that route passes)."""
    import aiohttp

    from kvmap.loadgen.server_metrics import served_models
    root = http_endpoint(entry).root
    try:
        models = await served_models(session, root, headers=entry.headers())
    except aiohttp.ClientConnectorError as e:
        raise RuntimeError(f"endpoint {entry.name!r} is unreachable at {root}: {e}") from None
    ids = [str(m.get("id")) for m in models or []]
    if ids and entry.model not in ids:
        raise RuntimeError(f"endpoint {entry.name!r} does not serve model {entry.model!r}; "
                           f"its /v1/models lists {ids}")


def load_tokenizer(entry: EndpointEntry):
    from kvmap.loadgen.prompts import load_tokenizer as load
    return load(entry.tokenizer)
