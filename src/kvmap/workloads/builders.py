"""Builders: turn a ``WorkloadSpec`` into prompts. One function per ``spec.kind``, each
registered as that kind in ``WORKLOAD_KINDS`` (``spec.py``).

Each builder returns drafts -- ``WorkloadRequest``s with an empty ``request_id`` and, except
for traces, no ``arrival_s`` -- in the order they should be sent; ``presets.build_requests``
names them and stamps arrival times. All randomness comes from ``source.rng``, and all
text from ``source.take``, so a spec and a tokenizer always give the same requests.
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from kvmap.workloads.corpus import TextSource
from kvmap.workloads.lengths import Fixed
from kvmap.workloads.spec import WORKLOAD_KINDS, WorkloadRequest, WorkloadSpec
from kvmap.workloads.trace import load_trace

CITIES = ("Lisbon", "Nairobi", "Osaka", "Montreal", "Cusco", "Tromso", "Hanoi", "Tbilisi",
          "Valparaiso", "Reykjavik", "Marrakesh", "Adelaide", "Krakow", "Bergen", "Quito",
          "Dakar")
NEEDLE_ANSWER_TOKENS = 8          # max_tokens for a needle answer: 5 digits and a period
_SENTENCE_GAP = re.compile(r"(?<=[.!?])\s+")
_SENTENCE_END = re.compile(r'[.!?]["”)]?(?=\s|$)')


@WORKLOAD_KINDS.register("synthetic")
def build_synthetic(spec: WorkloadSpec, source: TextSource) -> list[WorkloadRequest]:
    """Independent prompts of ``prompt_len`` tokens asking for ``output_len`` tokens."""
    n = spec.num_requests
    prompt_lens = spec.prompt_len.sample(source.rng, n)
    output_lens = spec.output_len.sample(source.rng, n)
    return [WorkloadRequest("", source.take(int(p)), int(o), ignore_eos=spec.ignore_eos)
            for p, o in zip(prompt_lens, output_lens)]


def needle_prompt(document: str, depth: float, city: str, number: str) -> tuple[str, float]:
    """``document`` with the needle at the sentence boundary nearest ``depth``, then the question.

    Returns ``(prompt, actual_depth)``; depth is a fraction of the document's characters
    (0 = before the first sentence, 1 = after the last).
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth!r} must be in [0, 1]")
    needle = f"The special magic number for {city} is {number}."
    question = (f"What is the special magic number for {city}? "
                f"The special magic number for {city} is")
    cuts = [0, *(m.start() for m in _SENTENCE_GAP.finditer(document)), len(document)]
    cut = min(cuts, key=lambda c: abs(c - depth * len(document)))
    left, right = document[:cut].rstrip(), document[cut:].lstrip()
    body = " ".join(piece for piece in (left, needle, right) if piece)
    return f"{body}\n\n{question}", cut / max(1, len(document))


@WORKLOAD_KINDS.register("long-context")
def build_long_context(spec: WorkloadSpec, source: TextSource) -> list[WorkloadRequest]:
    """Documents of ~``prompt_len`` tokens (up to one sentence less: the document ends on a
    full stop) with a needle at depths evenly spaced in [0, 1].

    ``expected`` is the needle's 5-digit number; generation stops at EOS (``ignore_eos``
    is False) after at most ``NEEDLE_ANSWER_TOKENS``.
    """
    n = spec.num_requests
    prompt_lens = spec.prompt_len.sample(source.rng, n)
    # Tokens the needle and question add around the document (+4 for the joins).
    overhead = source.num_tokens(needle_prompt("", 0.0, "Valparaiso", "00000")[0]) + 4
    drafts = []
    for i, num_tokens in enumerate(prompt_lens):
        if num_tokens <= overhead:
            raise ValueError(f"long-context prompt length {num_tokens} tokens leaves no room "
                             f"for a document next to the ~{overhead}-token needle/question")
        document = source.take(int(num_tokens) - overhead)
        # Drop the sentence fragment the token cut left at the end (at most one sentence),
        # so a needle at depth 1 follows a full stop.
        ends = [m.end() for m in _SENTENCE_END.finditer(document)]
        if ends and ends[-1] >= 0.75 * len(document):
            document = document[:ends[-1]]
        city = CITIES[int(source.rng.integers(len(CITIES)))]
        number = str(int(source.rng.integers(10000, 100000)))
        depth = i / (n - 1) if n > 1 else 0.5
        prompt, actual_depth = needle_prompt(document, depth, city, number)
        drafts.append(WorkloadRequest("", prompt, NEEDLE_ANSWER_TOKENS, expected=number,
                                      needle_depth=actual_depth, ignore_eos=False))
    return drafts


def _conversations(spec: WorkloadSpec, source: TextSource, n: int
                   ) -> list[list[WorkloadRequest]]:
    """``n`` requests as conversations of ``spec.num_turns`` turns (the last may be shorter).

    Turn k's prompt = turn k-1's prompt + a stand-in assistant reply of turn k-1's
    ``max_tokens`` (corpus text: the model's real reply is not known in advance, so only
    the prompt part of the history is a reusable prefix) + the next user message.
    """
    user_lens = spec.prompt_len.sample(source.rng, n)
    reply_lens = spec.output_len.sample(source.rng, n)
    conversations = []
    for k0 in range(0, n, spec.num_turns):
        conv_id, history, turns = f"{spec.name}-c{k0 // spec.num_turns:04d}", "", []
        for turn, k in enumerate(range(k0, min(n, k0 + spec.num_turns))):
            prompt = f"{history}User: {source.take(int(user_lens[k]))}\n\nAssistant:"
            turns.append(WorkloadRequest("", prompt, int(reply_lens[k]), conversation_id=conv_id,
                                         turn=turn, ignore_eos=spec.ignore_eos))
            history = f"{prompt} {source.take(int(reply_lens[k]))}\n\n"
        conversations.append(turns)
    return conversations


def _interleave(queues: list[list[WorkloadRequest]], rng: np.random.Generator
                ) -> list[WorkloadRequest]:
    """Merge queues at random (weighted by what is left), keeping each queue's order."""
    queues, merged = [list(q) for q in queues if q], []
    while queues:
        weights = np.array([len(q) for q in queues], dtype=np.float64)
        i = int(rng.choice(len(queues), p=weights / weights.sum()))
        merged.append(queues[i].pop(0))
        if not queues[i]:
            queues.pop(i)
    return merged


@WORKLOAD_KINDS.register("multi-turn")
def build_multi_turn(spec: WorkloadSpec, source: TextSource) -> list[WorkloadRequest]:
    """Conversations sent turn by turn: every turn 0, then every turn 1, ..."""
    conversations = _conversations(spec, source, spec.num_requests)
    return [conv[t] for t in range(spec.num_turns) for conv in conversations if t < len(conv)]


def mixed_counts(num_requests: int) -> tuple[int, int, int]:
    """A mixed workload's (chat, multi-turn, long-context) request counts: 1/16 long, 1/4
    in conversations, the rest (>= 11/16, so >= 1) chat. The simulator draws the same."""
    num_long, num_turn = num_requests // 16, num_requests // 4
    return num_requests - num_long - num_turn, num_turn, num_long


def mixed_long_tokens(spec: WorkloadSpec) -> int:
    """A mixed workload's long prompts: 16x the chat mean, within the length's bound."""
    return min(int(16 * spec.prompt_len.mean_tokens), spec.prompt_len.max_tokens)


@WORKLOAD_KINDS.register("mixed")
def build_mixed(spec: WorkloadSpec, source: TextSource) -> list[WorkloadRequest]:
    """1/16 long-context needles (16x the chat mean length), 1/4 multi-turn, the rest chat."""
    num_chat, num_turn_requests, num_long = mixed_counts(spec.num_requests)
    queues = [[r] for r in build_synthetic(replace(spec, num_requests=num_chat), source)]
    if num_turn_requests:
        queues += _conversations(spec, source, num_turn_requests)
    if num_long:
        long_tokens = mixed_long_tokens(spec)
        long_spec = replace(spec, num_requests=num_long,
                            prompt_len=Fixed(long_tokens, max_tokens=long_tokens))
        queues += [[r] for r in build_long_context(long_spec, source)]
    return _interleave(queues, source.rng)


@WORKLOAD_KINDS.register("trace")
def build_trace(spec: WorkloadSpec, source: TextSource) -> list[WorkloadRequest]:
    """The trace's requests, with arrival times; ``prompt_tokens`` lines get corpus text."""
    return [WorkloadRequest("", e.prompt if e.prompt is not None else source.take(e.prompt_tokens),
                            e.max_tokens, arrival_s=e.arrival_s, ignore_eos=spec.ignore_eos)
            for e in load_trace(spec.trace_path)[:spec.num_requests]]
