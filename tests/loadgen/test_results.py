"""vLLM-defined metrics from raw results, exactly, on hand-made timestamps."""
from __future__ import annotations

import pytest

from kvmap.runs.store import REQUEST_SCHEMA, requests_table
from kvmap.loadgen.client import RawResult
from kvmap.loadgen.results import load_metrics, request_row, request_stats
from kvmap.loadgen.runner import Sent
from kvmap.workloads.spec import WorkloadRequest

T0 = 1000.0


def _sent(rid="a", sent=0.5, chunks=(0.7, 0.8, 1.0, 1.1), end=1.15, usage=4,
          kind=None, scheduled=0.5):
    r = RawResult(rid, sent_s=T0 + sent, chunk_times_s=[T0 + c for c in chunks],
                  end_s=None if end is None else T0 + end, num_prompt_tokens=9,
                  num_output_tokens=usage, finish_reason="length", http_status=200,
                  output_text="abcd")
    if kind:
        r.fail(kind, "boom")
    return Sent(WorkloadRequest(rid, "p", max_tokens=4), 0, scheduled, r)


def test_stats_follow_vllm_definitions():
    s = request_stats(_sent(), T0)
    assert s.arrival_s == pytest.approx(0.5)
    assert s.ttft_s == pytest.approx(0.2)                     # first content chunk - send
    assert s.itl_s == pytest.approx((0.1, 0.2, 0.1))          # gaps between chunks
    assert s.e2e_s == pytest.approx(0.6)                      # last content chunk - send
    assert s.tpot_s == pytest.approx((0.6 - 0.2) / 3)         # (e2e - ttft) / (n - 1)
    assert s.num_output_tokens == 4 and not s.failed


def test_usage_counts_tokens_not_chunks():
    # 2 chunks carrying 5 tokens: TPOT divides by 4 tokens, ITL is per chunk
    s = request_stats(_sent(chunks=(0.7, 1.1), usage=5), T0)
    assert s.num_output_tokens == 5
    assert s.tpot_s == pytest.approx(0.4 / 4)
    assert s.itl_s == pytest.approx((0.4,))


def test_no_usage_falls_back_to_chunks():
    s = request_stats(_sent(usage=None), T0)
    assert s.num_output_tokens == 4
    m = load_metrics([_sent(usage=None)], T0, 1.0)
    assert m["num_output_tokens_from_chunks"] == 1


def test_non_streaming_has_only_e2e():
    s = request_stats(_sent(chunks=(), end=1.5, usage=7), T0)
    assert s.ttft_s is None and s.tpot_s is None and s.itl_s == ()
    assert s.e2e_s == pytest.approx(1.0) and s.num_output_tokens == 7


def test_aggregate_failures_goodput_and_lag():
    good = _sent("a")
    slow = _sent("b", chunks=(1.5, 1.6), usage=2, end=1.7)        # TTFT 1.0 s
    bad = _sent("c", chunks=(), end=None, usage=None, kind="http_5xx")
    late = _sent("d", sent=0.55, scheduled=0.5)                   # sent 50 ms late
    m = load_metrics([good, slow, bad, late], T0, 2.0, slo={"ttft_s": 0.5})
    assert m["num_requests"] == 4 and m["num_completed"] == 3 and m["num_failed"] == 1
    assert m["failures_by_kind"] == {"http_5xx": 1}
    assert m["num_good_requests"] == 2 and m["goodput_requests_per_s"] == pytest.approx(1.0)
    assert m["requests_per_s"] == pytest.approx(1.5)
    assert m["num_output_tokens"] == 4 + 2 + 4
    assert m["output_tokens_per_s"] == pytest.approx(5.0)
    assert m["ttft_s"]["mean"] == pytest.approx((0.2 + 1.0 + 0.15) / 3)
    assert m["send_lag_s"]["max"] == pytest.approx(0.05)
    assert m["http_status_counts"] == {"200": 4}
    assert m["first_errors"] == ["http_5xx: boom"]


def test_rows_fit_the_store_schema():
    rows = [request_row(s, T0, cell_id="c", model="m", kv="remote", workload="w")
            for s in (_sent("a"), _sent("b", kind="timeout"))]
    table = requests_table(rows)
    assert table.schema == REQUEST_SCHEMA and table.num_rows == 2
    a, b = rows
    assert a["token_times_s"] == pytest.approx([0.7, 0.8, 1.0, 1.1])
    assert a["ttft_s"] == pytest.approx(0.2) and a["tbt_max_s"] == pytest.approx(0.2)
    assert a["num_output_tokens"] == 4 and a["failed"] is False and a["error"] is None
    assert b["failed"] is True and b["error"] == "timeout: boom"
