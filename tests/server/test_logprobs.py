"""Completions with ``logprobs`` (and ``echo``): OpenAI's legacy shape, and the values
equal log-probabilities computed in-process the same way (one teacher-forced pass
through the same KV configuration on the same weights)."""
from __future__ import annotations

import math

import pytest
import torch

from kvmap.model.byte_tokenizer import ByteTokenizer
from tests.conftest import make_tiny_llm, random_prompts

PROMPT = random_prompts([12], vocab=256, seed=5)[0]


@pytest.fixture(scope="module")
def in_process():
    """log-softmax (T-1, V) of the tiny model over a token sequence, in-process."""
    llm = make_tiny_llm()

    def logp(ids):
        return torch.log_softmax(llm.engine.score(list(ids)).float(), dim=-1)[:-1]
    return logp


@pytest.mark.parametrize("echo", [False, True])
def test_logprobs_match_in_process(tiny_server, in_process, echo):
    k = 3
    with tiny_server.client() as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8,
                                            "temperature": 0, "logprobs": k, "echo": echo,
                                            "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    out_ids = choice["token_ids"]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    all_ids = PROMPT + out_ids
    ref = in_process(all_ids)                     # row i predicts token i + 1
    first = 0 if echo else len(PROMPT)
    positions = range(first, len(all_ids))
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(positions)
    decode = ByteTokenizer().decode
    assert lp["tokens"] == [decode([all_ids[p]]) for p in positions]
    offsets = [0]
    for t in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp["text_offset"] == offsets
    for j, p in enumerate(positions):
        if p == 0:
            assert lp["token_logprobs"][j] is None and lp["top_logprobs"][j] is None
            continue
        want = ref[p - 1, all_ids[p]].item()
        assert math.isclose(lp["token_logprobs"][j], want, rel_tol=1e-4, abs_tol=1e-5)
        top = lp["top_logprobs"][j]
        values, ids = ref[p - 1].topk(k)
        for i, v in zip(ids.tolist(), values.tolist()):
            assert math.isclose(top[decode([i])], v, rel_tol=1e-4, abs_tol=1e-5) \
                or decode([i]) in [decode([x]) for x in ids.tolist() if x != i]
        assert len(top) <= k + 1
    # greedy: every generated token is the most likely one under the scored distribution
    for j, p in enumerate(range(len(PROMPT), len(all_ids))):
        assert ref[p - 1].argmax().item() == all_ids[p]


def test_prompt_perplexity_from_echo_equals_in_process(tiny_server, in_process):
    """What the bench's endpoint perplexity uses: echo + logprobs over the prompt."""
    with tiny_server.client() as c:
        lp = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                             "temperature": 0, "logprobs": 0,
                                             "echo": True}).json()["choices"][0]["logprobs"]
    served = lp["token_logprobs"][1:len(PROMPT)]
    ref = in_process(PROMPT)
    want = [ref[p - 1, PROMPT[p]].item() for p in range(1, len(PROMPT))]
    ppl_served = math.exp(-sum(served) / len(served))
    ppl_ref = math.exp(-sum(want) / len(want))
    assert abs(ppl_served - ppl_ref) <= 1e-3 * ppl_ref
