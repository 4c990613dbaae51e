"""Workloads: distributions (means at a fixed seed), arrivals, corpus, traces, presets."""
import json

import numpy as np
import pytest

from kvmap.workloads import PRESETS, WorkloadSpec, build_requests, get_preset
from kvmap.workloads.arrivals import ClosedLoop, Gamma, Poisson, parse_arrival
from kvmap.workloads.builders import needle_prompt
from kvmap.workloads.corpus import corpus_paragraphs, load_text_file, take_tokens
from kvmap.workloads.lengths import Fixed, LogNormal, Uniform, parse_length, sharegpt_prompt
from kvmap.workloads.trace import load_trace


class WordTokenizer:
    """Stand-in tokenizer: one id per whitespace-separated word."""

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text):
        for word in text.split():
            if word not in self.vocab:
                self.vocab[word] = len(self.words)
                self.words.append(word)
        return [self.vocab[w] for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def rng(seed=0):
    return np.random.default_rng(seed)


# ---- lengths ---------------------------------------------------------------------------

def test_length_distributions_hit_their_means():
    assert (Fixed(7).sample(rng(), 5) == 7).all()
    u = Uniform(10, 30).sample(rng(), 20_000)
    assert u.min() == 10 and u.max() == 30 and abs(u.mean() - 20) < 0.3
    x = sharegpt_prompt().sample(rng(), 50_000)
    assert x.dtype == np.int64 and abs(x.mean() / 230 - 1) < 0.03
    assert np.median(x) < x.mean()                    # right-skewed, like ShareGPT


def test_lengths_are_clipped_to_one_and_max():
    x = LogNormal(1000, sigma=3.0, max_tokens=50).sample(rng(), 1000)
    assert x.min() >= 1 and x.max() == 50
    assert (LogNormal(1.0, sigma=2.0).sample(rng(), 1000) >= 1).all()


def test_with_mean_and_parse_length():
    assert Uniform(192, 320).with_mean(64) == Uniform(48, 80)
    assert Fixed(256).with_mean(8192).sample(rng(), 1)[0] == 8192     # max raised to fit
    assert LogNormal(230).with_mean(50).mean_tokens == 50
    assert parse_length("512") == Fixed(512)
    assert parse_length("uniform:128:384") == Uniform(128, 384)
    assert parse_length("lognormal:230:0.5") == LogNormal(230, 0.5)
    for bad in ["uniform:5", "lognormal:x", "poisson:3", "fixed:0", "uniform:9:3"]:
        with pytest.raises(ValueError, match="length distribution"):
            parse_length(bad)
    with pytest.raises(ValueError, match="num_tokens=9 exceeds max_tokens=8"):
        Fixed(9, max_tokens=8)


# ---- arrivals --------------------------------------------------------------------------

def test_open_loop_is_rescaled_to_the_exact_rate_like_vllm():
    t = Poisson(4.0).arrival_times_s(rng(), 100)
    assert t[-1] == pytest.approx(25.0) and (np.diff(t) >= 0).all() and t[0] > 0
    assert (Poisson(float("inf")).arrival_times_s(rng(), 3) == 0).all()
    assert ClosedLoop(8).arrival_times_s(rng(), 3) is None and ClosedLoop(8).closed_loop


@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(burstiness, cv):
    gaps = np.diff(Gamma(2.0, burstiness=burstiness, rescale=False)
                   .arrival_times_s(rng(), 40_000))
    assert gaps.mean() == pytest.approx(0.5, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_parse_arrival_and_validation():
    assert parse_arrival("closed:8") == ClosedLoop(8)
    assert parse_arrival("gamma:2.5:0.5") == Gamma(2.5, burstiness=0.5)
    for bad in ["closed:0", "poisson:-1", "gamma:1", "uniform:3"]:
        with pytest.raises(ValueError, match="arrival process"):
            parse_arrival(bad)


# ---- corpus ----------------------------------------------------------------------------

def test_builtin_corpus_is_clean_distinct_prose():
    paragraphs = corpus_paragraphs()
    assert len(paragraphs) > 500 and len(set(paragraphs)) == len(paragraphs)
    assert not any(">>>" in p or "****" in p or "::=" in p for p in paragraphs)


def test_take_tokens_is_exact_deterministic_and_natural():
    tok = WordTokenizer()
    text = take_tokens(tok, 300, start_paragraph=5)
    assert len(tok.encode(text)) == 300
    assert text == take_tokens(tok, 300, start_paragraph=5)
    assert text != take_tokens(tok, 300, start_paragraph=6)
    assert len(set(text.split())) > 100                    # never one repeated word
    short = "One small paragraph.\n\nAnother one here."    # wraps around a short corpus
    assert take_tokens(tok, 10, text=short) == ("One small paragraph. Another one here. "
                                                "One small paragraph. Another")
    with pytest.raises(ValueError, match="num_tokens=0"):
        take_tokens(tok, 0)


def test_load_text_file_plain_jsonl_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("Hello there.\n\nSecond paragraph.")
    assert load_text_file(tmp_path / "a.txt") == "Hello there.\n\nSecond paragraph."
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert load_text_file(tmp_path / "b.jsonl") == "one\n\ntwo"
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"txt": "two"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*'text'"):
        load_text_file(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty.txt' has no text"):
        load_text_file(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="missing.txt' does not exist"):
        load_text_file(tmp_path / "missing.txt")


# ---- traces ----------------------------------------------------------------------------

def write_trace(path, *records):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records))
    return path


def test_trace_is_parsed_sorted_and_replayed(tmp_path):
    path = write_trace(tmp_path / "t.jsonl",
                       {"arrival_s": 1.5, "prompt": "Hi there", "max_tokens": 4},
                       "",
                       {"arrival_s": 0.5, "prompt_tokens": 12, "max_tokens": 2, "x": 1})
    entries = load_trace(path)
    assert [(e.line_no, e.arrival_s) for e in entries] == [(3, 0.5), (1, 1.5)]
    tok = WordTokenizer()
    reqs = build_requests(WorkloadSpec("t", "trace", None, arrival=None,
                                       trace_path=str(path)), tok)
    assert [r.arrival_s for r in reqs] == [0.5, 1.5] and reqs[1].prompt == "Hi there"
    assert len(tok.encode(reqs[0].prompt)) == 12 and reqs[0].max_tokens == 2
    closed = WorkloadSpec("t", "trace", 1, arrival=ClosedLoop(2), trace_path=str(path))
    assert [r.arrival_s for r in build_requests(closed, tok)] == [None]


@pytest.mark.parametrize("record, message", [
    ({"prompt": "x", "max_tokens": 1}, "line 2: missing field 'arrival_s'"),
    ({"arrival_s": -1, "prompt": "x", "max_tokens": 1}, "line 2: field 'arrival_s'=-1"),
    ({"arrival_s": 0, "prompt": "x"}, "line 2: missing field 'max_tokens'"),
    ({"arrival_s": 0, "prompt": "x", "max_tokens": 0}, "line 2: field 'max_tokens'=0"),
    ({"arrival_s": 0, "max_tokens": 1}, "line 2: needs exactly one of"),
    ({"arrival_s": 0, "prompt": "x", "prompt_tokens": 3, "max_tokens": 1}, "exactly one"),
    ({"arrival_s": 0, "prompt": "", "max_tokens": 1}, "line 2: field 'prompt'"),
    ({"arrival_s": 0, "prompt_tokens": 2.5, "max_tokens": 1}, "field 'prompt_tokens'=2.5"),
    ("{not json", "line 2: not valid JSON"),
    ([1, 2], "line 2: expected a JSON object"),
])
def test_trace_errors_name_line_and_field(tmp_path, record, message):
    good = {"arrival_s": 0, "prompt": "ok", "max_tokens": 1}
    with pytest.raises(ValueError, match=message):
        load_trace(write_trace(tmp_path / "t.jsonl", good, record))


def test_trace_file_errors(tmp_path):
    with pytest.raises(ValueError, match="nope.jsonl' does not exist"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="has no requests"):
        load_trace(write_trace(tmp_path / "e.jsonl", ""))


# ---- presets ---------------------------------------------------------------------------

def test_throughput_preset_prompts_have_their_lengths_and_no_shared_prefix():
    tok = WordTokenizer()
    spec = get_preset("throughput").with_sizes(num_requests=24)
    reqs = build_requests(spec, tok)
    assert len(reqs) == 24 and len({r.request_id for r in reqs}) == 24
    lengths = [len(tok.encode(r.prompt)) for r in reqs]
    assert min(lengths) >= 192 and max(lengths) <= 320
    assert all(r.arrival_s is None and 96 <= r.max_tokens <= 160 for r in reqs)
    assert len({tuple(tok.encode(r.prompt)[:8]) for r in reqs}) == 24
    assert [r.prompt for r in build_requests(spec, tok)] == [r.prompt for r in reqs]
    assert spec.concurrency == 128


def test_needle_sits_at_the_requested_depth():
    doc = "First one. Second one. Third one. Fourth one."
    prompt, depth = needle_prompt(doc, 0.5, "Osaka", "12345")
    assert prompt.startswith("First one. Second one. The special magic number for Osaka is "
                             "12345. Third one.")
    assert prompt.endswith("\n\nWhat is the special magic number for Osaka? "
                           "The special magic number for Osaka is")
    assert depth == pytest.approx(0.5, abs=0.1)
    assert needle_prompt(doc, 0.0, "Osaka", "1")[0].startswith("The special magic")


def test_long_context_preset():
    tok = WordTokenizer()
    spec = get_preset("long-context").with_sizes(num_requests=3, prompt_tokens=400)
    reqs = build_requests(spec, tok)
    depths = [r.needle_depth for r in reqs]
    assert depths[0] == 0.0 and depths[2] == 1.0 and 0.3 < depths[1] < 0.7
    for r in reqs:
        assert len(r.expected) == 5 and f"is {r.expected}." in r.prompt
        assert 340 <= len(tok.encode(r.prompt)) <= 400 and not r.ignore_eos
    assert ". The special magic number for" in reqs[2].prompt      # after a full stop


def test_multi_turn_preset_shares_history():
    spec = get_preset("multi-turn").with_sizes(num_requests=10, prompt_tokens=20,
                                               output_tokens=10)
    reqs = build_requests(spec, WordTokenizer())
    assert [r.turn for r in reqs] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    by_conv: dict[str, list] = {}
    for r in reqs:
        by_conv.setdefault(r.conversation_id, []).append(r)
    assert sorted(len(v) for v in by_conv.values()) == [2, 4, 4]
    for turns in by_conv.values():
        for prev, cur in zip(turns, turns[1:]):
            assert cur.prompt.startswith(prev.prompt) and cur.prompt.endswith("Assistant:")


def test_mixed_preset_has_every_kind_and_ordered_arrivals():
    spec = get_preset("mixed").with_sizes(num_requests=32, prompt_tokens=20, output_tokens=8)
    reqs = build_requests(spec, WordTokenizer())
    times = [r.arrival_s for r in reqs]
    assert len(reqs) == 32 and times == sorted(times) and times[-1] == pytest.approx(16.0)
    assert sum(r.expected is not None for r in reqs) == 2          # 32 // 16
    assert sum(r.conversation_id is not None for r in reqs) == 8    # 32 // 4
    turns = [(r.conversation_id, r.turn) for r in reqs if r.conversation_id]
    assert all(turns.index((c, t - 1)) < turns.index((c, t)) for c, t in turns if t)


def test_presets_and_spec_validation():
    assert set(PRESETS) == {"throughput", "long-context", "multi-turn", "mixed"}
    with pytest.raises(ValueError, match="'nope' is not one of"):
        get_preset("nope")
    with pytest.raises(ValueError, match="kind='chat'"):
        WorkloadSpec("x", "chat", 4)
    with pytest.raises(ValueError, match="num_requests=0"):
        WorkloadSpec("x", "synthetic", 0)
    with pytest.raises(ValueError, match="arrival=None"):
        WorkloadSpec("x", "synthetic", 4, arrival=None)
    with pytest.raises(ValueError, match="needs trace_path"):
        WorkloadSpec("x", "trace", None, arrival=None)
