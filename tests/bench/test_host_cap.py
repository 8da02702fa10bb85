"""The ``host_cap`` workload's pure parts: its HTTP client's reading of responses, and the report's
table and the goals it says were missed, with where the time went."""

from __future__ import annotations

import json

import click
import pytest

from llamactor.bench import report
from llamactor.bench.host_cap_report import legs_of, missed_goals, report_lines
from llamactor.cli.commands import front_end_counts
from llamactor.bench.http_load import dechunk, parse_response

pytestmark = pytest.mark.pure


def _leg(tok_s: float, ratio: float | None = None, front: float = 0.0) -> dict[str, float]:
    out = {"tokens_per_s": tok_s, "batcher_ms": 2.0, "wall_ms": 4.0, "steps": 96, "batcher_us_per_token": 20.0,
           "front_us_per_token": front, "other_us_per_token": 0.0}
    return out if ratio is None else {**out, "vs_in_process": ratio}


RESULTS = {"host_cap": {"max_sequences": 126,
                        "c64": {"max_tokens": 128, "submit": _leg(30_000), "stream": _leg(28_000, 0.93, 5.0),
                                "http": _leg(29_000, 0.97, 3.0), "sse": _leg(15_000, 0.5, 30.0)},
                        "c126": {"max_tokens": 96, "submit": _leg(20_000), "stream": _leg(19_000, 0.95, 5.0),
                                 "http": _leg(19_000, 0.95, 3.0), "sse": _leg(19_000, 0.95, 9.0),
                                 "sse_fp": {**_leg(18_500, 0.925, 40.0), "link_us_per_token": 2.5}}}}


def test_the_report_has_a_row_per_size_and_leg_and_names_each_missed_goal_with_where_time_went() -> None:
    lines = report_lines(RESULTS)
    assert sum(line.startswith("| 64 |") for line in lines) == 4 and sum(line.startswith("| 126 |") for line in lines) == 5
    assert "| 126 | 96 | sse_fp | 18,500 | 0.93 | 2.00 | 4.00 | 20.0 | 40.0 |" in lines  # a front-end process's leg
    assert "- the engine's link to the front-end process, CPU per token: sse_fp at 126: 2.5 µs" in lines
    assert "| 64 | 128 | sse | 15,000 | 0.50 | 2.00 | 4.00 | 20.0 | 30.0 |" in lines
    missed = missed_goals(RESULTS["host_cap"])
    assert len(missed) == 2  # in-process 20k < 25k at 126; SSE 0.5x at 64
    assert "in-process 20,000 tok/s at 126" in missed[0] and "sse at 64 streams, 0.50×" in missed[1]
    assert "front end 30.0 µs" in missed[1]
    assert report_lines({"host_cap": {"error": "boom"}}) == []


def test_the_goals_are_read_from_the_results_by_the_reports_targets() -> None:
    verdicts = {v["target"]: v for v in report.verdicts(RESULTS)}
    assert verdicts["host cap c=64: HTTP SSE / in-process"]["value"] == 0.5
    assert not verdicts["host cap c=64: HTTP SSE / in-process"]["met"]
    assert verdicts["host cap c=126: HTTP non-streamed / in-process"]["met"]


def test_the_client_reads_a_chunked_sse_body_and_its_usage_and_refuses_a_stream_cut_short() -> None:
    events = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b'data: {"choices":[],"usage":'
              b'{"completion_tokens":7}}\n\n', b"data: [DONE]\n\n"]
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    assert dechunk(body) == b"".join(events)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert parse_response(head + body, stream=True) == (7, 3)
    cut = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events[:2]) + b"0\r\n\r\n"
    with pytest.raises(ValueError, match="DONE"):
        parse_response(head + cut, stream=True)
    plain = b"HTTP/1.1 200 OK\r\ncontent-length: 40\r\n\r\n" + json.dumps({"usage": {"completion_tokens": 5}}).encode()
    assert parse_response(plain, stream=False) == (5, 0)
    with pytest.raises(ValueError, match="429"):
        parse_response(b"HTTP/1.1 429 Too Many Requests\r\n\r\n{}", stream=False)


def test_legs_through_more_front_end_processes_follow_the_others_in_the_report_and_its_goals() -> None:
    row = {"max_tokens": 128, "submit": _leg(30_000), "http": _leg(29_000, 0.97), "sse_fp4": _leg(20_000, 0.667, 50.0),
           "sse_fp": _leg(18_000, 0.6, 40.0), "http_fp2": _leg(28_000, 0.93), "sse_fp2": {**_leg(27_000, 0.9, 45.0),
                                                                                        "link_us_per_token": 3.0}}
    assert legs_of(row) == ["submit", "http", "sse_fp", "http_fp2", "sse_fp2", "sse_fp4"]
    lines = report_lines({"host_cap": {"max_sequences": 126, "c64": row}})
    rows = [line.split(" | ")[2] for line in lines if line.startswith("| 64 |")]
    assert rows == ["submit", "http", "sse_fp", "http_fp2", "sse_fp2", "sse_fp4"]
    assert "| 64 | 128 | sse_fp2 | 27,000 | 0.90 | 2.00 | 4.00 | 20.0 | 45.0 |" in lines
    assert "- the engine's link to the front-end process, CPU per token: sse_fp2 at 64: 3.0 µs" in lines
    missed = missed_goals({"c64": row})
    assert [m.split(",")[0] for m in missed] == ["- missed: sse_fp at 64 streams", "- missed: sse_fp4 at 64 streams"]


def test_the_bench_takes_the_counts_of_front_end_processes_as_a_comma_list() -> None:
    assert front_end_counts("1,4") == (1, 4) and front_end_counts("2, 2") == (2,)
    for bad in ("0", "65", "two", ""):
        with pytest.raises(click.BadParameter, match="from 1 to 64"):
            front_end_counts(bad)
