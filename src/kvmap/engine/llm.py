"""``LLM``: the user-facing API over the engine.

    from kvmap import LLM, SamplingParams
    llm = LLM()                                   # embedded SmolLM2-135M-Instruct
    outs = llm.generate(["prompt", ...], SamplingParams(max_tokens=64))
    outs[0].text, outs[0].token_ids, outs[0].metrics
    llm.chat([{"role": "user", "content": "..."}], SamplingParams(...))
    llm.kv_usage()
"""
from __future__ import annotations

import torch

from kvmap.config import DTYPES, EngineArgs
from kvmap.engine.engine import Engine
from kvmap.kv.config import KVConfig
from kvmap.request import RequestOutput, SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, dtype: str = "auto", kv: str = "auto",
                 kv_memory: str | int | None = "256MiB", block_size: int = 16,
                 num_blocks: int | None = None, device: str | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512,
                 enable_prefix_caching: bool = True, num_threads: int | None = None,
                 seed: int = 0, quantization: str | None = None, *,
                 args: EngineArgs | None = None):
        """Keyword arguments are those of ``kvmap.config.EngineArgs`` (``kv_memory`` may
        be a byte size or ``"N tokens"`` of the model's bf16 KV); ``args`` gives them
        as one ``EngineArgs`` instead. ``quantization``: None | "int8" | "w8a8" | "int4",
        the weights' format (``kvmap.model.wquant``), combinable with any ``kv`` spec."""
        if args is None:
            args = EngineArgs(model=model, dtype=dtype, kv=kv,
                              kv_memory=kv_memory if kv_memory is not None else "256MiB",
                              num_blocks=num_blocks, block_size=block_size,
                              max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens,
                              enable_prefix_caching=enable_prefix_caching,
                              num_threads=num_threads, device=device, seed=seed,
                              quantization=quantization)
        from kvmap.model.loader import load_model   # heavy imports only when used
        args = args.resolved()          # dtype and kv "auto", device None: this machine's
        kv_config = KVConfig.parse(args.kv, args.dtype)   # bad specs fail before weights
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        config = args.engine_config()
        loaded = load_model(args.model, getattr(torch, DTYPES[args.dtype]), args.device,
                            quantization=args.quantization)
        self.engine = Engine(config, loaded, kv_config)
        self.tokenizer = self.engine.tokenizer
        self.config = config
        self.args = args

    @classmethod
    def from_args(cls, args: EngineArgs) -> LLM:
        return cls(args=args)

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
