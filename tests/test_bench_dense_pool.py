"""``python -m benchmarks.dense_pool``: both variants run, interleaved, same centroids."""

from __future__ import annotations

import pytest

from benchmarks import dense_pool


def test_quick_run_compares_both_variants(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--dataset", "blobs", "--quick", "--k", "20", "--steps", "3", "--repeats", "2"]
    assert dense_pool.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count(" before ") == 2 and out.count(" pooled ") == 2
    assert "before: median wall" in out and "pooled: median wall" in out
    assert "centroids bit-identical: yes" in out
