import torch

from kvmap.engine.calibration import collect_kv_samples
from kvmap.kv.codecs.calibrate import load_ranges
from tests.conftest import make_tiny_llm, random_prompts


def test_collects_what_the_cache_stores(tmp_path):
    llm = make_tiny_llm()
    chunks = random_prompts([20, 9], seed=3)
    samples = collect_kv_samples(llm, chunks)
    cfg = llm.model_config
    assert len(samples) == cfg.num_layers
    k, v = samples[0]
    assert k.shape == (29, cfg.num_kv_heads, cfg.head_dim) and v.shape == k.shape
    # the recorder is removed again and the samples equal the engine's own K for chunk 0
    assert type(llm.engine.kv.codec).__name__ == "FP32"
    engine = llm.engine
    req = engine.add_request(chunks[0], __import__("kvmap").SamplingParams(max_tokens=3))
    engine.step()
    stored = engine.kv.layers[0].blocks["k"].view(-1, cfg.num_kv_heads, cfg.head_dim)
    slots = torch.tensor([req.block_ids[i // 4] * 4 + i % 4 for i in range(20)])
    assert torch.allclose(stored[slots], k[:20])


def test_static_int8_from_calibration_runs(tmp_path):
    from kvmap.engine.calibration import calibrate_model
    llm = make_tiny_llm()
    path = calibrate_model(llm, random_prompts([40], seed=4), tmp_path / "r.json")
    assert len(load_ranges(path)) == llm.model_config.num_layers
    q = make_tiny_llm(kv=f"int8(granularity=channel,scale=static(path={path}))")
    out = q.generate(random_prompts([12], seed=5), __import__("kvmap").SamplingParams(
        max_tokens=5, ignore_eos=True))[0]
    assert len(out.token_ids) == 5
