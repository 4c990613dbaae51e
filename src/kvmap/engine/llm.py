"""``LLM``: the user-facing API over the engine.

    from kvmap import LLM, SamplingParams
    llm = LLM()                                   # embedded SmolLM2-135M-Instruct
    outs = llm.generate(["prompt", ...], SamplingParams(max_tokens=64))
    outs[0].text, outs[0].token_ids, outs[0].metrics
    llm.chat([{"role": "user", "content": "..."}], SamplingParams(...))
    llm.kv_usage()
"""
from __future__ import annotations

from dataclasses import fields

from kvmap.config import EngineArgs
from kvmap.engine.builder import build_engine
from kvmap.request import RequestOutput, SamplingParams

Prompt = str | list[int]


_SETTINGS = frozenset(f.name for f in fields(EngineArgs))


class LLM:
    def __init__(self, model: str | None = None, *, args: EngineArgs | None = None,
                 **settings):
        """``settings`` are the fields of ``kvmap.config.EngineArgs`` (``dtype``, ``kv``,
        ``kv_memory`` -- a byte size or ``"N tokens"`` of the model's bf16 KV --,
        ``quantization``: None | "int8" | "w8a8" | "int4", ...); ``args`` gives them as one
        ``EngineArgs`` instead. ValueError names an unknown setting or a bad value."""
        unknown = sorted(set(settings) - _SETTINGS)
        if unknown:
            raise ValueError(f"LLM: unknown setting(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(sorted(_SETTINGS - {'model'}))}")
        if args is None:
            if settings.get("kv_memory", "") is None:     # None: the default budget
                del settings["kv_memory"]
            args = EngineArgs(model=model, **settings)
        elif settings or model is not None:
            raise ValueError("LLM: give the settings as args=EngineArgs(...) or as keywords, "
                             "not both")
        self.args = args.resolved()      # dtype and kv "auto", device None: this machine's
        self.engine = build_engine(self.args)
        self.tokenizer = self.engine.tokenizer
        self.config = self.engine.config

    @property
    def model_config(self):
        return self.engine.model_config

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer; pass token id lists")
            return self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompt {prompt!r} is neither a string nor a list of token ids")
        return list(prompt)

    def generate(self, prompts: Prompt | list[Prompt],
                 params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run all prompts to completion with continuous batching; outputs in input order.
        All prompts are validated before any is queued."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        param_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(param_list) != len(prompts):
            raise ValueError(f"{len(param_list)} SamplingParams for {len(prompts)} prompts")
        encoded = [self.encode(p) for p in prompts]
        reqs = []
        try:
            for p, ids, sp in zip(prompts, encoded, param_list):
                reqs.append(self.engine.add_request(ids, sp, prompt=p if isinstance(p, str)
                                                    else None))
        except ValueError:
            for r in reqs:
                self.engine.abort(r.request_id)
                self.engine.pop_finished(r.request_id)
            raise
        while self.engine.has_unfinished():
            self.engine.step()
        return [self.engine.pop_finished(r.request_id) for r in reqs]

    def chat(self, messages: list[dict] | list[list[dict]],
             params: SamplingParams | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer/chat template")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True)
                   for c in convs]
        return self.generate(prompts, params)

    def weight_bytes(self) -> int:
        """Resident bytes of the weights as they run (quantized codes and scales)."""
        return self.engine.model.weight_bytes

    def kv_usage(self) -> dict:
        """``Engine.stats().to_dict()``: pool bytes and blocks, queues, counters, tiers."""
        return self.engine.kv_usage()

    def stats(self):
        """The engine's typed ``EngineStats``."""
        return self.engine.stats()
