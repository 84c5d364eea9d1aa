"""The 2026-12-06 lab entry's re-derive command (docs/journal/lab/2026-12-06-h100-spread-pairs.md), run
on its kept raw data: every table row the entry quotes, and its stream and start-time figures, must be
what the command prints (the entry's numbers are parsed, not copied here)."""

from __future__ import annotations

import math
import re

import pytest
from journal_commands import re_derive

from specgate_lab.analyses.spread_campaign import cluster_interval, request_counts, trim_record

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def derived() -> tuple[str, str]:
    return re_derive("lab/2026-12-06-h100-spread-pairs.md", "spread_campaign")


def test_every_table_row_the_entry_quotes_re_derives(derived) -> None:
    text, out = derived
    rows = [line for line in text.splitlines() if re.match(r"\| (ngram|draft_l6|acc-\d\d) \|", line)]
    assert len(rows) >= 12
    printed = set(out.splitlines())
    assert [row for row in rows if row not in printed] == []


def test_the_gate_was_undecided_at_exactly_one_in_every_later_start(derived) -> None:
    text, out = derived
    checks = int(re.search(r"undecided in all (\d+) checks", text).group(1))
    verdicts = re.findall(r"^\| acc-0[2-9] \| \w+ \| \w+ \| (\w+) \| ([\d.]+) ", out, re.M)
    assert len(verdicts) == checks and set(verdicts) == {("undecided", "1.000")}


def test_the_stream_and_start_figures_re_derive(derived) -> None:
    text, out = derived
    per_step, low, high = re.search(r"The streams give ([\d.]+) accepted tokens per\s+decode step, with a "
                                    r"per-prompt 95 % interval of (\d\.\d+)-(\d\.\d+)", text).groups()
    assert f"| ngram | coding | acc-01 | 176 | 558 | 4.1705 | 3.8152-4.5257 | {per_step} | {low}-{high} |" in out
    counted, of = re.search(r"the streams counted (\d+) of vLLM's (\d+) accepted tokens", text).groups()
    assert f"| {counted}/{of} |" in out
    first_ngram, first_draft = re.search(r"ngram: (\d+) s at its first start.*draft_l6: (\d+) s", text, re.S).groups()
    assert f"acc-01: ngram {first_ngram} s, draft_l6 {first_draft} s" in out


def test_a_request_counts_its_accepted_tokens_from_its_chunks() -> None:
    record = trim_record({"request_id": "r", "prompt_id": "p", "completion_tokens": 10, "text": "abc",
                          "chunk_times": [0.1, 0.2, 0.3, 0.4]})
    assert record["chunks"] == 4 and len(record["text_sha1"]) == 12 and "chunk_times" not in record
    assert request_counts(record) == (6, 3)  # 10 tokens in 4 chunks: 6 accepted over 3 decode steps
    assert request_counts({"completion_tokens": 1, "chunks": 1}) is None


def test_the_cluster_interval_is_the_delta_methods() -> None:
    # Two prompts: 2 of 4 and 6 of 4 accepted per step: R = 1, residuals -2 and +2.
    r, se, half = cluster_interval([(2.0, 4.0), (6.0, 4.0)])
    assert r == 1.0
    assert se == pytest.approx(math.sqrt(2 / 1 * 8) / 8)
    assert half == pytest.approx(12.706204736 * se)
    assert cluster_interval([(3.0, 3.0), (3.0, 3.0)])[1] == 0.0  # identical prompts: no width
