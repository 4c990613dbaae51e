"""Requests, their sampling parameters, their timestamps and their outputs."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature=0`` is greedy."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0                 # 0 = off
    top_p: float = 1.0
    seed: int | None = None        # per-request generator seed
    stop: tuple[str, ...] = ()     # stop strings (not included in the text)
    stop_token_ids: frozenset[int] = frozenset()   # a set: checked for every token
    ignore_eos: bool = False
    # log-probabilities (``kvmap.engine.logprobs``): of each output token, and of each
    # prompt token from the second, with this many most likely alternatives (None: off)
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", frozenset(self.stop_token_ids))
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) \
                or self.max_tokens <= 0:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be a positive integer")
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) \
                or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r} must be finite and >= 0")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0 = off)")
        if any(not s for s in self.stop):
            raise ValueError(f"stop={self.stop!r} contains an empty string")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise ValueError(f"{name}={value!r} must be an integer >= 0 (or None)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"          # blocks dropped, waiting to be recomputed
    FINISHED_STOPPED = "stop"        # EOS, stop token or stop string
    FINISHED_LENGTH = "length"       # max_tokens or the context limit
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


@dataclass
class RequestMetrics:
    """Raw timestamps (seconds, ``time.perf_counter`` clock) of one request.

    ``token_times_s[i]`` is when output token i was produced; token 0 is the first token,
    so TTFT = token_times_s[0] - arrival_s. Derived metrics live in ``kvmap.metrics``.
    """

    arrival_s: float
    first_scheduled_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    finished_s: float | None = None
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0    # prompt tokens served from the prefix cache
    num_preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.arrival_s if self.token_times_s else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times_s)

    def to_dict(self) -> dict:
        return {
            "arrival_s": self.arrival_s,
            "first_scheduled_s": self.first_scheduled_s,
            "token_times_s": list(self.token_times_s),
            "finished_s": self.finished_s,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_cached_prompt_tokens": self.num_cached_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "num_preemptions": self.num_preemptions,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
        }


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: RequestMetrics
    logprobs: object | None = None      # ``kvmap.engine.logprobs.ScoredTokens`` when asked
    error: str | None = None            # why the engine failed this request (not an abort)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Request:
    """One sequence in the engine: prompt, generated tokens, KV bookkeeping, timestamps.

    Token counts (all in tokens of this sequence):
    - ``num_tokens``: prompt + generated so far.
    - ``num_computed_tokens``: tokens whose forward pass is done (their KV was written);
      the next token to compute is at position ``num_computed_tokens``.
    - ``num_kv_slots``: KV slots the sequence holds. Equal to ``num_computed_tokens``
      unless a selection policy evicted tokens (then smaller); slot i lives at
      ``block_ids[i // block_size] * block_size + i % block_size``.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_s: float, prompt: str | None = None):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)
        self.params = params
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_kv_slots = 0
        self.num_hashed_blocks = 0          # leading blocks registered in the prefix cache
        self.block_hashes: list[bytes] = []
        self.metrics = RequestMetrics(arrival_s=arrival_s,
                                      num_prompt_tokens=len(prompt_token_ids))
        self.generator = None               # torch.Generator for seeded sampling
        self.output_text = ""
        self.finish_reason: str | None = None
        self.evicted: bool = False          # a selection policy dropped some of its KV
        self.policy_acc = None  # (layers, H, slots) attention received (H2O-style)
        # per-layer budgets: layer -> (first, end) slots a policy left empty (read only
        # while ``evicted``; see engine/policy_runner.py)
        self.kv_holes: dict | None = None
        self.policy_layer_budgets: list[int] | None = None   # memo of the policy's split
        self.page_faults = 0                  # paged-out pages lost (engine.MAX_PAGE_FAULTS)
        # hybrid models: leading groups of block_ids whose sliding-layer blocks went back
        # to the pool (PagedKVCache.release_slid_out)
        self.num_slid_out_blocks = 0
        # teacher forcing: the next tokens are these instead of sampled ones, and the
        # logits of every sampling step are kept (Engine.score)
        self.forced_token_ids: list[int] | None = None
        self.recorded_logits: list = []
        self.logprobs = None    # ``kvmap.engine.logprobs.TokenLogprobs`` when params ask
        self.cache_salt: bytes | None = None   # this request's prefix-hash salt (tenant)
        self.error: str | None = None       # a fault in this request's sampling or stops

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_tokens - 1

    def to_output(self) -> RequestOutput:
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids),
                             self.output_text, list(self.output_token_ids),
                             self.finish_reason, self.metrics,
                             self.logprobs.scored(self.token_ids)
                             if self.logprobs is not None else None, self.error)
