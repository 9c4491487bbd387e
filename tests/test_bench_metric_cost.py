"""benchmarks.metric_cost: one line per fit of each variant (metric, weights) on the same
unit rows, then the medians, and with ``--out`` the JSON, markdown and plot."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.metric_cost import _weights, main, mean_dissimilarity
from tests.testkit import blobs


def test_mean_dissimilarity_is_one_minus_the_largest_cosine():
    A = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    C = np.array([[3.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    assert np.isclose(mean_dissimilarity(A, C), (0.0 + (1 - np.sqrt(0.5))) / 2, atol=1e-12)


def test_the_weighted_variants_draw_their_weights_from_the_seed():
    assert _weights("euclidean", 5, 0) is None and _weights("cosine", 5, 0) is None
    assert np.array_equal(_weights("weights1", 5, 0), np.ones(5))
    w = _weights("weights", 1000, 3)
    assert np.array_equal(w, _weights("weights", 1000, 3))
    assert set(np.unique(w)) == {1.0, 2.0, 3.0, 4.0}


def test_each_variant_fits_the_same_unit_rows(tmp_path, capsys):
    X = blobs(400, 4, 3, seed=1) + np.float32(3.0)
    np.savez(tmp_path / "d.npz", train=X[:300], test=X[300:])
    out = tmp_path / "out"
    assert main(["--data", str(tmp_path / "d.npz"), "--k", "3", "--seeds", "2",
                 "--repeats", "1", "--out", str(out)]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if not line.startswith("#")]
    variants = ["euclidean", "cosine", "weights1", "weights"]
    assert [(r[0], r[1]) for r in rows] == [(v, s) for s in "01" for v in variants]
    for r in rows:
        assert float(r[7]) > 0.0 and float(r[8]) > 0.0  # distances, seconds per million
        assert 0.0 <= float(r[9]) < 0.2 and 0.0 <= float(r[10]) < 0.2
    assert "(300, 4)" in lines[0]
    assert lines[-1].startswith("# weights / euclidean, median fit: ")
    doc = json.loads((out / "results.json").read_text())
    assert [f["variant"] for f in doc["fits"]] == [v for _ in "01" for v in variants]
    assert set(doc["medians"]) == set(variants)
    assert str(tmp_path) not in json.dumps(doc)  # no machine's paths
    table = (out / "results.md").read_text()
    assert all(f"| {v} |" in table for v in variants)
    assert (out / "fit-seconds.png").stat().st_size > 0
