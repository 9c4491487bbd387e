"""benchmarks.metric_cost: one line per fit of each metric on the same unit rows, then the
medians."""

from __future__ import annotations

import numpy as np

from benchmarks.metric_cost import main, mean_dissimilarity
from tests.testkit import blobs


def test_mean_dissimilarity_is_one_minus_the_largest_cosine():
    A = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    C = np.array([[3.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    assert np.isclose(mean_dissimilarity(A, C), (0.0 + (1 - np.sqrt(0.5))) / 2, atol=1e-12)


def test_each_metric_fits_the_same_unit_rows(tmp_path, capsys):
    X = blobs(400, 4, 3, seed=1) + np.float32(3.0)
    np.savez(tmp_path / "d.npz", train=X[:300], test=X[300:])
    assert main(["--data", str(tmp_path / "d.npz"), "--k", "3", "--seeds", "2",
                 "--repeats", "1"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert [(r[0], r[1]) for r in rows] == [("euclidean", "0"), ("cosine", "0"),
                                            ("euclidean", "1"), ("cosine", "1")]  # fmt: skip
    for r in rows:
        assert float(r[7]) > 0.0 and float(r[8]) > 0.0  # distances, seconds per million
        assert 0.0 <= float(r[9]) < 0.2 and 0.0 <= float(r[10]) < 0.2
    assert "(300, 4)" in lines[0]
    assert lines[-1].startswith("# cosine / euclidean, median fit: ")
