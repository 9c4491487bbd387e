"""benchmarks.estimator_hashes: one line per fit, the same hashes for the same data and seeds."""

from __future__ import annotations

import numpy as np

from benchmarks.estimator_hashes import main
from tests.testkit import blobs


def test_hashes_repeat_and_follow_the_data(tmp_path, capsys):
    X = blobs(600, 4, 5, seed=3)
    np.savez(tmp_path / "a.npz", train=X)
    np.savez(tmp_path / "b.npz", train=X + np.float32(1.0))

    def lines(name: str) -> list[list[str]]:
        assert main(["--data", str(tmp_path / name), "--k", "5", "--seeds", "2"]) == 0
        rows = [line.split() for line in capsys.readouterr().out.splitlines()]
        assert [r[0] for r in rows[:2]] == ["#", "#"]
        return [r[:-1] for r in rows[2:]]  # without the wall time

    a = lines("a.npz")
    assert [(r[0], r[1]) for r in a] == [("first", "0"), ("first", "1"),
                                         ("k-means++", "0"), ("k-means++", "1"),
                                         ("auto", "0"), ("auto", "1")]  # fmt: skip
    assert lines("a.npz") == a
    assert [r[5] for r in lines("b.npz")] != [r[5] for r in a]
