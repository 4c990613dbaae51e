"""Accuracy tasks over an endpoint's completions API, through the evals ``Task`` API.

``EndpointLLM`` is what a task's ``run(llm, samples)`` needs of an ``LLM``, over HTTP:

- ``generate(prompts, params)``: one non-streamed completion per prompt (text or token
  ids) at temperature 0, with the task's ``max_tokens``, ``stop`` and ``ignore_eos`` --
  ``passkey``, ``needle``, ``qa`` run unchanged;
- ``prompt_logprobs(ids, k)``: the prompt's log-probabilities and top-k from ``echo:
  true`` + ``logprobs: k`` with ``max_tokens: 1`` (OpenAI's legacy shape; ``kvmap serve``
  and vLLM answer it), else vLLM's ``prompt_logprobs: k`` extra (``endpoint_logprobs``),
  for ``prompt_ppl`` (``ppl_definition: prompt_logprobs``; KL and top-1 over the
  returned top-k, ``evals.topk``);
- ``tokenizer``: the endpoint's (``tokenizer:``), which builds the samples;
- ``engine = None``: the server's pool is not ours to read (no ``kv_bytes_peak``).

A task the endpoint cannot answer is ``unavailable`` for it, with the reason
(``EndpointUnavailable``): ``ppl`` and ``mc`` (scored through kvmap's own engine), tasks
that compare with the baseline's outputs inside one cell (``needs_baseline_state``) unless
their records carry what the comparison needs (``compares_records``: ``generation``'s
output ids, compared with the baseline's cell in the report), a ``module:function``
task, and log-probabilities the server does not return. ``generation`` and
``chat_generation`` are sent as completions at temperature 0 with the task's
``max_tokens`` (``ignore_eos`` for the fixed-length one, natural stopping for the chat
one); ``finish_reason`` is the server's, ``e2e_s`` the client's clock around the
request. The baseline
of the endpoint's figures is its ``baseline:`` (another endpoint, or a KV spec of
kvmap's own cells; default the model's dtype), paired by ``sample_id`` in the report.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from kvmap.bench.cellspec import CellSpec
from kvmap.bench.endpoint_http import endpoint_info, http_endpoint, load_tokenizer
from kvmap.bench.endpoint_spec import EndpointEntry, EndpointUnavailable

ENGINE_SCORED = {"ppl": "it scores a continuation decoded one step at a time through "
                        "kvmap's own cache (ppl_definition: continuation); over HTTP use "
                        "task prompt_ppl (ppl_definition: prompt_logprobs)",
                 "mc": "it scores choices through kvmap's own engine"}
REQUEST_TIMEOUT_S = 600.0


class EndpointLLM:
    """The ``LLM`` surface the evals tasks use, over HTTP (module docstring)."""

    engine = None

    def __init__(self, entry: EndpointEntry, tokenizer):
        self.entry, self.tokenizer = entry, tokenizer
        self.url = http_endpoint(entry).url

    def _post(self, body: dict) -> dict:
        data = json.dumps({"model": self.entry.model, "temperature": 0.0, "stream": False,
                           **body}).encode()
        request = urllib.request.Request(self.url, data=data, headers={
            "Content-Type": "application/json", **self.entry.headers()})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            message = e.read(2000).decode(errors="replace")
            raise HTTPRefused(self.entry.name, e.code, message) from None
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"endpoint {self.entry.name!r} is unreachable at "
                               f"{self.url}: {e}") from None

    def generate(self, prompts: list, params) -> list:
        from kvmap.request import RequestMetrics, RequestOutput
        outputs = []
        for i, prompt in enumerate(prompts):
            # the output's own ids (vLLM's and kvmap serve's extra; others ignore it):
            # re-encoding the text may not give back the tokens the server sampled
            body = {"prompt": prompt, "max_tokens": params.max_tokens,
                    "return_token_ids": True}
            if params.stop:
                body["stop"] = list(params.stop)
            if params.ignore_eos:
                body["ignore_eos"] = True
            t0 = time.perf_counter()
            answer = self._post(body)
            choice = _first_choice(answer, self.entry)
            text = choice.get("text")
            if not isinstance(text, str):
                raise RuntimeError(f"endpoint {self.entry.name!r}: a completion without "
                                   f"text: {str(choice)[:200]}")
            usage = answer.get("usage") or {}
            ids = choice.get("token_ids")
            ids = list(ids) if isinstance(ids, list) else self.tokenizer.encode(text)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            metrics = RequestMetrics(arrival_s=t0, finished_s=time.perf_counter(),
                                     num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
                                     num_cached_prompt_tokens=int(cached))
            outputs.append(RequestOutput(f"ep-{i}", prompt if isinstance(prompt, str)
                                         else None, [], text, ids,
                                         choice.get("finish_reason"), metrics))
        return outputs

    def prompt_logprobs(self, token_ids: list[int], num_top: int = 0):
        """``PromptLogprobs`` of the prompt (``endpoint_logprobs``): from ``echo`` +
        ``logprobs: num_top``, else vLLM's ``prompt_logprobs`` extra;
        ``EndpointUnavailable`` with both answers when the server gives neither."""
        from kvmap.bench.endpoint_logprobs import from_echo, from_vllm
        ids = list(token_ids)
        try:
            answer = self._post({"prompt": ids, "max_tokens": 1, "echo": True,
                                 "logprobs": num_top})
            found = from_echo(_first_choice(answer, self.entry), len(ids), num_top)
            if not isinstance(found, str):
                return found
            echo = found
        except HTTPRefused as e:
            echo = f"echo + logprobs refused: {e.answer}"
        try:
            answer = self._post({"prompt": ids, "max_tokens": 1, "prompt_logprobs": num_top})
            found = from_vllm(_first_choice(answer, self.entry), ids, num_top)
        except HTTPRefused as e:
            found = None
            echo += f"; prompt_logprobs refused: {e.answer}"
        if found is None:
            raise EndpointUnavailable(f"endpoint {self.entry.name!r} returned no prompt "
                                      f"log-probabilities: {echo}")
        return found


class HTTPRefused(RuntimeError):
    """An HTTP error answer of endpoint ``name``; ``answer`` is what it said."""

    def __init__(self, name: str, status: int, message: str):
        self.status, self.message = status, message
        self.answer = f"HTTP {status}: {message[:300]}"
        super().__init__(f"endpoint {name!r} answered {self.answer}")


def _first_choice(answer: dict, entry: EndpointEntry) -> dict:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RuntimeError(f"endpoint {entry.name!r}: a completion without choices: "
                           f"{str(answer)[:200]}")
    return choices[0]


def _evaluator(cell: CellSpec):
    from kvmap.bench.tasks import eval_options, resolve_task
    from kvmap.evals import get_task
    task, name = cell.task, cell.endpoint.name
    if not task.is_accuracy_task:
        raise EndpointUnavailable(f"task {task.name!r} on endpoint {name!r}: a "
                                  "module:function task takes kvmap's own LLM")
    fn = resolve_task(task.task)
    if fn in ENGINE_SCORED:
        raise EndpointUnavailable(f"task {fn!r} on endpoint {name!r}: {ENGINE_SCORED[fn]}")
    evaluator = get_task(fn, eval_options(task.params, cell.seed))
    if evaluator.needs_baseline_state and not evaluator.compares_records:
        raise EndpointUnavailable(f"task {fn!r} on endpoint {name!r}: it compares with the "
                                  "baseline's outputs inside one cell, which an endpoint "
                                  "cell does not run")
    return evaluator


def run_endpoint_task(cell: CellSpec, progress: Callable[[float], None]
                      ) -> tuple[dict, dict]:
    """``(metrics, details)`` of an accuracy-task cell on ``cell.endpoint``."""
    import asyncio

    from kvmap.bench.endpoint_http import check_served
    from kvmap.loadgen.runner import open_session
    entry = cell.endpoint
    evaluator = _evaluator(cell)

    async def check() -> None:
        async with open_session(http_endpoint(entry)) as session:
            await check_served(session, entry)
    asyncio.run(check())
    llm = EndpointLLM(entry, load_tokenizer(entry))
    samples = evaluator.prepare(llm.tokenizer)
    progress(0.1)
    run = evaluator.run(llm, samples)
    metrics = {**run.metrics, "endpoint": endpoint_info(entry),
               "peak_kv_resident_bytes": None, "kv_capacity_bytes": entry.kv_memory_bytes,
               "baseline_kv": entry.baseline}        # None: kvmap's own cell of the dtype
    return metrics, {"per_sample": run.per_sample}
