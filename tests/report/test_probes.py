"""The checklist probes (kvmap.bench.probes): on the tiny random model, and on a fake
LLM whose output depends on the batch (so the stability probe must catch it)."""
from __future__ import annotations

from types import SimpleNamespace

from kvmap.bench import probes


def test_probes_on_the_tiny_model(tiny_llm):
    result = probes.run_probes(tiny_llm)
    s = result["stability"]
    assert s["identical"] and s["num_tokens"] == probes.STABILITY_NEW_TOKENS
    assert s["batch_size"] == 1 + len(probes.STABILITY_NEIGHBOUR_TOKENS)
    ops = result["decode_ops"]
    assert ops["num_steps"] == probes.NUM_PROFILED_STEPS
    assert 10 < ops["num_ops_per_step"] <= ops["num_ops_all"]
    assert not tiny_llm.engine.has_unfinished() and not tiny_llm.engine.requests


class BatchSensitiveLLM:
    """Greedy output that changes from token 5 on when other prompts share the batch."""

    tokenizer = None
    model_config = SimpleNamespace(vocab_size=100)

    def generate(self, prompts, params):
        outs = []
        for p in prompts:
            ids = [p[0] % 7 + k for k in range(params.max_tokens)]
            if len(prompts) > 1:
                ids[5:] = [99] * (len(ids) - 5)
            outs.append(SimpleNamespace(token_ids=ids))
        return outs


def test_stability_reports_where_outputs_diverge():
    s = probes.stability(BatchSensitiveLLM())
    assert not s["identical"] and s["num_identical_prefix"] == 5


def test_a_failing_probe_is_recorded_not_raised():
    result = probes.run_probes(BatchSensitiveLLM())     # has no engine: decode_ops fails
    assert "error" in result["decode_ops"] and "AttributeError" in result["decode_ops"]["error"]
    assert result["stability"]["identical"] is False
