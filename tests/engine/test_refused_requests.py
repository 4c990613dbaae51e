"""A refused request leaves no trace in the engine (issue 38): every check runs before
anything is stored, so ``engine.requests``, the waiting queue and the Python heap stay
flat over thousands of refused adds, and each refusal names its real parameter (a
``cache_salt`` with a lone surrogate names ``cache_salt``, not ``prompt``)."""
from __future__ import annotations

import gc
import tracemalloc

import pytest

from kvmap import SamplingParams
from kvmap.engine.refusal import InvalidRequest, check_text, unencodable_at
from tests.conftest import make_tiny_llm

PROMPT = list(range(3, 40))


def refusals(engine):
    """(keyword arguments of add_request, the parameter its refusal must name)."""
    vocab = engine.model_config.vocab_size
    ok = dict(prompt_token_ids=PROMPT, params=SamplingParams(max_tokens=4),
              prompt="x" * 2000)
    return [
        ({**ok, "cache_salt": "tenant-\ud800"}, "cache_salt"),
        ({**ok, "cache_salt": 7}, "cache_salt"),
        ({**ok, "prompt": "a lone \udfff surrogate"}, "prompt"),
        ({**ok, "prompt_token_ids": PROMPT + [vocab]}, "prompt"),
        ({**ok, "prompt_token_ids": []}, "prompt"),
        ({**ok, "prompt_token_ids": [5] * engine.model_config.max_position_embeddings},
         "prompt"),
        ({**ok, "params": {"max_tokens": 4}}, "params"),
        ({**ok, "request_id": "taken"}, "request_id"),
    ]


@pytest.fixture(scope="module")
def engine():
    llm = make_tiny_llm()
    llm.engine.add_request(PROMPT, SamplingParams(max_tokens=2), request_id="taken")
    return llm.engine


@pytest.mark.parametrize("case", range(8))
def test_each_refusal_names_its_parameter_and_stores_nothing(engine, case):
    kwargs, param = refusals(engine)[case]
    before = (dict(engine.requests), list(engine.scheduler.waiting))
    with pytest.raises(InvalidRequest) as info:
        engine.add_request(**kwargs)
    assert info.value.param == param, str(info.value)
    assert (dict(engine.requests), list(engine.scheduler.waiting)) == before


def test_thousands_of_refused_adds_leave_the_engine_and_the_heap_flat(engine):
    cases = refusals(engine)
    num_requests, num_waiting = len(engine.requests), len(engine.scheduler.waiting)

    def refuse(n: int) -> None:
        for i in range(n):
            kwargs, _ = cases[i % len(cases)]
            with pytest.raises(ValueError):
                engine.add_request(**kwargs)
    refuse(200)                                  # warm caches, interned strings
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        refuse(4000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(engine.requests) == num_requests
    assert len(engine.scheduler.waiting) == num_waiting
    # a stored refusal is ~2 KB of prompt text alone: 4,000 would be > 8 MB
    assert grown < 256 * 1024, grown


def test_a_refused_request_id_can_be_used_again(engine):
    with pytest.raises(InvalidRequest):
        engine.add_request(PROMPT, SamplingParams(max_tokens=2), request_id="again",
                           cache_salt="\ud801")
    req = engine.add_request(PROMPT, SamplingParams(max_tokens=2), request_id="again",
                             cache_salt="tenant")
    assert engine.requests["again"] is req and req.cache_salt is not None


def test_text_checks():
    assert unencodable_at("ok ✓ 🙂") is None and unencodable_at("ab\udc80") == 2
    with pytest.raises(InvalidRequest, match=r"U\+DC80 at character 2") as info:
        check_text("ab\udc80", "messages.0.content")
    assert info.value.param == "messages.0.content"
