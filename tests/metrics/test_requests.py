"""Metric math against hand-computed timelines (every expected number worked out below)."""
import numpy as np
import pytest

from kvmap.metrics import (aggregate, meets_slo, normalize_slo, parse_slo, percentile,
                                 request_stats, summarize)
from kvmap.request import RequestMetrics, RequestOutput

# Dyadic times (multiples of 1/8) keep the float arithmetic exact.
#   A: arrives 0, scheduled 0.25, tokens at 1, 1.5, 2.5, 3, finished 3.25
#      ttft 1, gaps .5 1 .5, e2e 3.25, tpot (3.25 - 1) / 3 = .75, queue .25
#   B: arrives 1, scheduled 1, one token at 1.5, finished 1.5
#      ttft .5, no gaps, e2e .5, tpot undefined, queue 0
#   C: arrives 2, scheduled 2.5, tokens at 3, 3.25, finished 3.25
#      ttft 1, gap .25, e2e 1.25, tpot .25, queue .5
#   D: arrives 3, never finished -> failed
A = RequestMetrics(0.0, 0.25, [1.0, 1.5, 2.5, 3.0], 3.25, num_prompt_tokens=10,
                   num_cached_prompt_tokens=4, num_preemptions=1)
B = RequestMetrics(1.0, 1.0, [1.5], 1.5, num_prompt_tokens=6)
C = RequestMetrics(2.0, 2.5, [3.0, 3.25], 3.25, num_prompt_tokens=8)
D = RequestMetrics(3.0, 3.0, [3.5], None, num_prompt_tokens=5)


def test_percentile_interpolates_linearly_like_numpy():
    assert percentile([4, 1, 3, 2], 50) == 2.5            # between 2 and 3
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)   # rank 2.7 -> 3 + .7
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([1, 2, 3, 4], 100) == 4
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    values = np.random.default_rng(0).random(101)
    assert percentile(values, 37.5) == pytest.approx(np.percentile(values, 37.5))
    with pytest.raises(ValueError, match="101"):
        percentile([1.0], 101)


def test_summarize_hand_computed():
    # ranks: p50 -> 2 (value 3); p90 -> 3.6 -> 4 + .6 * 6 = 7.6; p99 -> 3.96 -> 9.76
    assert summarize([1, 2, 3, 4, 10]) == pytest.approx(
        {"mean": 4.0, "p50": 3.0, "p90": 7.6, "p99": 9.76, "max": 10.0})
    assert summarize([]) is None


def test_request_stats_of_a_full_timeline():
    s = request_stats(A)
    assert (s.ttft_s, s.e2e_s, s.tpot_s, s.queue_s) == (1.0, 3.25, 0.75, 0.25)
    assert s.itl_s == (0.5, 1.0, 0.5)
    assert (s.num_output_tokens, s.failed) == (4, False)


def test_one_token_and_zero_tokens_have_no_tpot():
    one = request_stats(B)
    assert one.tpot_s is None and one.itl_s == () and one.ttft_s == 0.5
    zero = request_stats(RequestMetrics(0.0, 0.0, [], 0.5))
    assert zero.ttft_s is None and zero.tpot_s is None and zero.e2e_s == 0.5
    assert not zero.failed


def test_failed_requests_are_recognised_in_every_input_form():
    assert request_stats(D).failed
    assert request_stats(A.to_dict()) == request_stats(A)
    assert request_stats({**A.to_dict(), "error": "timeout"}).failed
    aborted = RequestOutput("r", "p", [1], "x", [2], "abort", A)
    assert request_stats(aborted).failed
    assert not request_stats(RequestOutput("r", "p", [1], "x", [2], "length", A)).failed


def test_aggregate_hand_computed():
    m = aggregate([A, B, C, D], duration_s=4.0)
    assert (m["num_requests"], m["num_completed"], m["num_failed"]) == (4, 3, 1)
    assert m["num_prompt_tokens"] == 24 and m["num_output_tokens"] == 7    # D excluded
    assert m["num_cached_prompt_tokens"] == 4 and m["num_preemptions"] == 1
    assert m["requests_per_s"] == 0.75                  # 3 completed / 4 s
    assert m["output_tokens_per_s"] == 1.75             # 7 / 4
    assert m["total_tokens_per_s"] == 7.75              # (24 + 7) / 4
    # TTFT [1, .5, 1]: mean 2.5/3; p50 1; p90 rank 1.8 -> 1; max 1
    assert m["ttft_s"] == pytest.approx(
        {"mean": 2.5 / 3, "p50": 1.0, "p90": 1.0, "p99": 1.0, "max": 1.0})
    # TBT pools every gap [.5, 1, .5, .25]: sorted .25 .5 .5 1; p50 .5; p90 rank 2.7 -> .85
    assert m["tbt_s"] == pytest.approx(
        {"mean": 0.5625, "p50": 0.5, "p90": 0.85, "p99": 0.985, "max": 1.0})
    # TPOT [.75, .25] (B has one token): p90 = .25 + .9 * .5 = .7
    assert m["tpot_s"] == pytest.approx(
        {"mean": 0.5, "p50": 0.5, "p90": 0.7, "p99": 0.745, "max": 0.75})
    assert m["e2e_s"]["mean"] == pytest.approx(5.0 / 3) and m["e2e_s"]["max"] == 3.25
    assert m["queue_s"] == pytest.approx(
        {"mean": 0.25, "p50": 0.25, "p90": 0.45, "p99": 0.495, "max": 0.5})
    assert m["goodput_requests_per_s"] is None and m["slo_violations"] is None


def test_goodput_counts_requests_meeting_every_threshold():
    # ttft <= 1 passes A, B, C (1 <= 1 passes: thresholds are inclusive, as in vLLM);
    # tpot <= .5 fails A (.75), passes B (one token counts as tpot 0) and C (.25).
    m = aggregate([A, B, C, D], duration_s=4.0, slo={"ttft_s": 1.0, "tpot_s": 0.5})
    assert m["num_good_requests"] == 2 and m["goodput_requests_per_s"] == 0.5
    # e2e <= 1.25 passes B (.5) and C (1.25); tbt (worst gap) <= .5 fails A (1.0).
    m = aggregate([A, B, C, D], duration_s=4.0, slo=parse_slo("e2e=1250ms,tbt=0.5s"))
    assert m["num_good_requests"] == 2
    zero_tokens = request_stats(RequestMetrics(0.0, 0.0, [], 0.5))
    assert not meets_slo(zero_tokens, {"ttft_s": 10.0})       # no TTFT, cannot meet it
    assert meets_slo(zero_tokens, {"e2e_s": 10.0})
    assert not meets_slo(request_stats(D), {"e2e_s": 10.0})   # failed never counts


def test_aggregate_slo_violations_name_the_measured_value():
    m = aggregate([A, B, C], duration_s=4.0, slo=parse_slo("ttft_p50=1s,tbt_max=0.5s"))
    assert m["slo_violations"] == {"tbt_max_s": 1.0}           # p50 TTFT 1.0 meets 1s
    assert m["goodput_requests_per_s"] is None                 # no per-request keys
    m = aggregate([D], duration_s=1.0, slo={"ttft_p99_s": 1.0})
    assert m["slo_violations"] == {"ttft_p99_s": None}         # no data is a miss


def test_aggregate_edge_cases():
    empty = aggregate([])
    assert empty["num_requests"] == 0 and empty["ttft_s"] is None
    assert empty["requests_per_s"] is None and empty["duration_s"] is None
    assert aggregate([D], duration_s=2.0)["requests_per_s"] == 0.0
    # duration_s=None: first arrival (0) to last finish (3.25) of completed requests
    assert aggregate([A, B, C, D])["duration_s"] == 3.25
    with pytest.raises(ValueError, match="duration_s=0"):
        aggregate([A], duration_s=0)


def test_parse_slo_units_aliases_and_errors():
    assert parse_slo("ttft_p99=2s,tbt_p99=150ms") == {"ttft_p99_s": 2.0, "tbt_p99_s": 0.15}
    assert parse_slo("itl_p99:150ms e2el=3s ttft=.5s") == {
        "tbt_p99_s": 0.15, "e2e_s": 3.0, "ttft_s": 0.5}
    assert normalize_slo({"ttft": 1, "tpot_mean_s": 0.1}) == {"ttft_s": 1.0, "tpot_mean_s": 0.1}
    for bad, needle in [("ttft=2", "'2'"), ("speed=2s", "speed"), ("ttft", "'ttft'"),
                        ("", "empty"), ("ttft=1s,ttft=2s", "twice"), ("ttft=0ms", "ttft"),
                        ("ttft_p101=1s", "ttft_p101"), ("queue=1s", "queue"),
                        ("ttft=2min", "2min")]:
        with pytest.raises(ValueError, match=needle):
            parse_slo(bad)
