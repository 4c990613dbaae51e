"""The simulated workload: token counts and arrival times, from the bench's own workloads.

The simulator needs lengths, not text, so :func:`requests_from_spec` draws them from a
:class:`kvmap.workloads.spec.WorkloadSpec` (the same presets, length distributions and
arrival processes as ``kvmap bench``) in the order the workload builders draw them: a
synthetic spec gives the same prompt and output lengths as the bench's requests. This
scales to any number of requests without a tokenizer. :func:`requests_from_workload`
converts already-built ``WorkloadRequest``s with their exact token counts (calibration).

Conversations: turn ``k`` re-sends turn ``k - 1``'s prompt and reply, so its first
``prefix_tokens = prompt_{k-1} + output_{k-1}`` tokens are a prefix the serving system may
still hold (as in real chat serving, where the reply is the model's own; the bench's
stand-in replies make only the prompt part reusable). The simulator names a conversation's
blocks by (conversation, block index), so a later turn finds the earlier turn's full blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvmap.registry import Registry
from kvmap.workloads.builders import NEEDLE_ANSWER_TOKENS, mixed_counts, mixed_long_tokens
from kvmap.workloads.spec import WorkloadSpec
from kvmap.workloads.trace import load_trace

CHARS_PER_TOKEN = 4          # a trace line with text but no token count: a rough estimate


@dataclass(frozen=True)
class SimRequest:
    """One request: ``arrival_s`` None in a closed loop; ``conversation_id`` None for an
    independent request (its blocks are its own)."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    conversation_id: str | None = None
    turn: int = 0
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens={self.prompt_tokens} "
                             f"and output_tokens={self.output_tokens} must be >= 1")


def _conversations(spec: WorkloadSpec, rng: np.random.Generator, n: int, prefix: str
                   ) -> list[list[SimRequest]]:
    user_lens = spec.prompt_len.sample(rng, n)
    reply_lens = spec.output_len.sample(rng, n)
    conversations = []
    for k0 in range(0, n, spec.num_turns):
        conv_id, history, turns = f"{prefix}c{k0 // spec.num_turns:04d}", 0, []
        for turn, k in enumerate(range(k0, min(n, k0 + spec.num_turns))):
            prompt = history + int(user_lens[k])
            turns.append(SimRequest("", prompt, int(reply_lens[k]), conversation_id=conv_id,
                                    turn=turn, prefix_tokens=history))
            history = prompt + int(reply_lens[k])
        conversations.append(turns)
    return conversations


def _synthetic(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> list[SimRequest]:
    prompt_lens = spec.prompt_len.sample(rng, n)
    output_lens = spec.output_len.sample(rng, n)
    return [SimRequest("", int(p), int(o)) for p, o in zip(prompt_lens, output_lens)]


# kind -> its drafter: the lengths (no text) of a ``kvmap.workloads`` kind, drawn in its
# builder's order with its rules; every workload kind has one (a test holds it)
SIM_DRAFTS: Registry = Registry("simulated workload kind")


@SIM_DRAFTS.register("synthetic")
def _draft_synthetic(spec: WorkloadSpec, rng: np.random.Generator) -> list[SimRequest]:
    return _synthetic(spec, rng, spec.num_requests)


@SIM_DRAFTS.register("long-context")
def _draft_long_context(spec: WorkloadSpec, rng: np.random.Generator) -> list[SimRequest]:
    return [SimRequest("", int(p), NEEDLE_ANSWER_TOKENS)
            for p in spec.prompt_len.sample(rng, spec.num_requests)]


@SIM_DRAFTS.register("multi-turn")
def _draft_multi_turn(spec: WorkloadSpec, rng: np.random.Generator) -> list[SimRequest]:
    conversations = _conversations(spec, rng, spec.num_requests, f"{spec.name}-")
    return [c[t] for t in range(spec.num_turns) for c in conversations if t < len(c)]


@SIM_DRAFTS.register("mixed")
def _draft_mixed(spec: WorkloadSpec, rng: np.random.Generator) -> list[SimRequest]:
    num_chat, num_turn, num_long = mixed_counts(spec.num_requests)
    drafts = _synthetic(spec, rng, num_chat)
    if num_turn:
        conversations = _conversations(spec, rng, num_turn, f"{spec.name}-")
        drafts += [c[t] for t in range(spec.num_turns) for c in conversations if t < len(c)]
    long_tokens = mixed_long_tokens(spec)
    drafts += [SimRequest("", long_tokens, NEEDLE_ANSWER_TOKENS)] * num_long
    order = rng.permutation(len(drafts))
    # keep each conversation's turns in order: stable sort of turns within positions
    mixed = [drafts[i] for i in order]
    turns: dict[str, list[SimRequest]] = {}
    for r in mixed:
        if r.conversation_id:
            turns.setdefault(r.conversation_id, []).append(r)
    for queue in turns.values():
        queue.sort(key=lambda r: r.turn)
    return [turns[r.conversation_id].pop(0) if r.conversation_id else r for r in mixed]


@SIM_DRAFTS.register("trace")
def _draft_trace(spec: WorkloadSpec, rng: np.random.Generator) -> list[SimRequest]:
    entries = load_trace(spec.trace_path)[:spec.num_requests]
    return [SimRequest("", e.prompt_tokens or max(1, len(e.prompt) // CHARS_PER_TOKEN),
                       e.max_tokens, arrival_s=e.arrival_s) for e in entries]


def _draft(spec: WorkloadSpec, rng: np.random.Generator) -> list[SimRequest]:
    if spec.kind not in SIM_DRAFTS:
        raise ValueError(f"workload kind {spec.kind!r} is not simulated")
    return SIM_DRAFTS[spec.kind](spec, rng)


def requests_from_spec(spec: WorkloadSpec) -> list[SimRequest]:
    """The requests of ``spec`` (lengths and arrivals only), named ``<name>-00000`` and up.

    Deterministic for a spec (its ``seed``). A trace keeps its own arrival times unless
    the spec re-times it; a closed loop leaves ``arrival_s`` None.
    """
    rng = np.random.default_rng(spec.seed)
    drafts = _draft(spec, rng)
    if spec.kind == "trace" and spec.arrival is None:
        times = [d.arrival_s for d in drafts]
    else:
        raw = spec.arrival.arrival_times_s(rng, len(drafts))
        times = [None] * len(drafts) if raw is None else [float(t) for t in raw]
    return [SimRequest(f"{spec.name}-{i:05d}", d.prompt_tokens, d.output_tokens, t,
                       d.conversation_id, d.turn, d.prefix_tokens)
            for i, (d, t) in enumerate(zip(drafts, times))]


def requests_from_workload(requests, tokenizer) -> list[SimRequest]:
    """``WorkloadRequest``s (as ``build_requests`` returns them) with exact token counts."""
    out = []
    for r in requests:
        num_prompt = len(tokenizer.encode(r.prompt))
        out.append(SimRequest(r.request_id, num_prompt, r.max_tokens, r.arrival_s))
    return out
