"""What a workload is (``WorkloadSpec``) and what it produces (``WorkloadRequest``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from kvmap.registry import Registry
from kvmap.workloads.arrivals import ArrivalProcess, ClosedLoop
from kvmap.workloads.lengths import Fixed, LengthDist

# kind -> its builder (``builders.py``: each registers itself; importing
# ``kvmap.workloads`` imports them); the simulator draws the same kinds
# (``kvmap.plan.sim.workload``)
WORKLOAD_KINDS: Registry = Registry("workload kind")


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload, ready for ``LLM.generate`` or the HTTP load client.

    ``arrival_s`` is seconds from the start of the run, ``None`` in a closed loop.
    In a conversation, ``turn`` counts from 0 and the prompt of turn k starts with the
    whole prompt of turn k-1: a bench should not send turn k before turn k-1 finished.
    ``expected`` is the answer a correct model continues with (long-context needles),
    ``needle_depth`` where the needle sits, as a fraction of the document's characters.
    """

    request_id: str
    prompt: str
    max_tokens: int
    arrival_s: float | None = None
    conversation_id: str | None = None
    turn: int | None = None
    expected: str | None = None
    needle_depth: float | None = None
    ignore_eos: bool = True


@dataclass(frozen=True)
class WorkloadSpec:
    """A reproducible request stream: same spec and tokenizer, same requests.

    ``kind`` picks the builder (see ``kvmap.workloads.presets``); ``prompt_len`` means
    the prompt length for ``synthetic``, the whole prompt for ``long-context``, each user
    message for ``multi-turn``, the chat prompts for ``mixed``. ``arrival=None`` is only
    for ``trace`` (replay the trace's own times); any other process re-times a trace.
    ``num_requests=None`` (trace only) replays every line.
    """

    name: str
    kind: str
    num_requests: int | None
    prompt_len: LengthDist = Fixed(256)
    output_len: LengthDist = Fixed(128)
    arrival: ArrivalProcess | None = ClosedLoop(8)
    seed: int = 0
    num_turns: int = 4                    # multi-turn and mixed
    ignore_eos: bool = True               # generate exactly max_tokens, as vLLM benchmarks do
    corpus_path: str | None = None        # None = the built-in corpus
    trace_path: str | None = None         # kind == "trace"

    def __post_init__(self) -> None:
        if self.kind not in WORKLOAD_KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {WORKLOAD_KINDS.names()}")
        if self.num_requests is None:
            if self.kind != "trace":
                raise ValueError(f"num_requests=None is only allowed for kind='trace', "
                                 f"not {self.kind!r}")
        elif not isinstance(self.num_requests, int) or self.num_requests < 1:
            raise ValueError(f"num_requests={self.num_requests!r} must be an integer >= 1")
        for name in ("prompt_len", "output_len"):
            if not isinstance(getattr(self, name), LengthDist):
                raise ValueError(f"{name}={getattr(self, name)!r} is not a LengthDist")
        if self.arrival is None and self.kind != "trace":
            raise ValueError(f"arrival=None is only allowed for kind='trace', "
                             f"not {self.kind!r}")
        if self.arrival is not None and not isinstance(self.arrival, ArrivalProcess):
            raise ValueError(f"arrival={self.arrival!r} is not an ArrivalProcess")
        if not isinstance(self.num_turns, int) or self.num_turns < 2:
            raise ValueError(f"num_turns={self.num_turns!r} must be an integer >= 2")
        if self.kind == "trace" and not self.trace_path:
            raise ValueError("kind='trace' needs trace_path")

    @property
    def concurrency(self) -> int | None:
        """Requests kept in flight for a closed loop; ``None`` for open-loop arrivals."""
        return self.arrival.concurrency if isinstance(self.arrival, ClosedLoop) else None

    def with_sizes(self, num_requests: int | None = None, prompt_tokens: int | None = None,
                   output_tokens: int | None = None) -> WorkloadSpec:
        """A copy with fewer/more requests or moved mean lengths (``None`` keeps a size)."""
        spec = self
        if num_requests is not None:
            spec = replace(spec, num_requests=num_requests)
        if prompt_tokens is not None:
            spec = replace(spec, prompt_len=spec.prompt_len.with_mean(prompt_tokens))
        if output_tokens is not None:
            spec = replace(spec, output_len=spec.output_len.with_mean(output_tokens))
        return spec
