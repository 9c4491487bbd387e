"""What the client's push reads (nmbatch_client.sources): npy, CSV, Parquet and Arrow
files, a batch of rows at a time, and iterators of arrays; the rows' idempotency keys
across batches. No service: the push operation is driven with made-up answers."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from nmbatch_client.cli import progress_bar
from nmbatch_client.operations import Answer, Call, Limits, push_operation
from nmbatch_client.sources import SourceError, is_source, open_source

RNG = np.random.default_rng(7)
X = RNG.normal(size=(103, 4)).astype(np.float32)


def rows(source: Any, **options: Any) -> tuple[list[np.ndarray], int | None]:
    batches = open_source(source, **options)
    return [np.asarray(a) for a in batches.arrays], batches.total


def test_arrays_are_not_sources_and_paths_and_iterators_are(tmp_path: Path) -> None:
    assert not is_source(X) and not is_source([[1.0, 2.0]]) and not is_source(((1.0,),))
    assert not is_source(np.float32(1.0))
    assert is_source(str(tmp_path / "x.npy")) and is_source(tmp_path / "x.parquet")
    assert is_source(iter([X])) and is_source(a for a in [X]) and is_source(range(3))
    with pytest.raises(ValueError, match="columns"):
        open_source(iter([X]), columns="a")
    with pytest.raises(ValueError, match="batch_rows"):
        open_source(iter([X]), batch_rows=0)


def test_npy_is_memory_mapped_and_flattened(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", X.reshape(103, 2, 2))
    (A,), total = rows(tmp_path / "x.npy")
    assert total == 103 and isinstance(open_source(tmp_path / "x.npy").arrays.__next__(),
                                       np.memmap)  # fmt: skip
    np.testing.assert_array_equal(A, X)
    np.save(tmp_path / "v.npy", X[0])
    with pytest.raises(SourceError, match="2-D"):
        open_source(tmp_path / "v.npy")
    with pytest.raises(SourceError, match="no such file"):
        open_source(tmp_path / "absent.npy")
    (tmp_path / "x.json").write_text("[]")
    with pytest.raises(SourceError, match=r"unknown file type '\.json'"):
        open_source(tmp_path / "x.json")


def test_csv_is_read_in_batches_and_its_header_names_the_columns(tmp_path: Path) -> None:
    values = np.round(X.astype(np.float64), 3)
    path = tmp_path / "x.csv"
    np.savetxt(path, values, delimiter=",", header="a,b,c,d", comments="", fmt="%.3f")
    batches, total = rows(path, batch_rows=10)
    assert total == 103 and [len(b) for b in batches] == [10] * 10 + [3]
    np.testing.assert_array_equal(np.concatenate(batches), values)
    picked, _ = rows(path, columns=["d", "a"], batch_rows=50)
    np.testing.assert_array_equal(np.concatenate(picked), values[:, [3, 0]])
    with pytest.raises(SourceError, match="no column 'e'"):
        open_source(path, columns="e")
    # No header: every line is numbers, and columns cannot be named.
    bare = tmp_path / "bare.tsv"
    np.savetxt(bare, values[:5], delimiter="\t", fmt="%.3f")
    (A,), total = rows(bare)
    assert total == 5
    np.testing.assert_array_equal(A, values[:5])
    with pytest.raises(SourceError, match="no header line"):
        open_source(bare, columns="a")
    # A bad line fails its batch, naming the lines.
    broken = tmp_path / "broken.csv"
    broken.write_text("a,b\n1,2\n3,4\n5,x\n")
    batches_of_two = open_source(broken, batch_rows=2).arrays
    np.testing.assert_array_equal(next(batches_of_two), [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(SourceError, match="lines 4-4"):
        next(batches_of_two)


def _table(embedding: pa.Array) -> pa.Table:
    return pa.table({"id": np.arange(len(embedding)), "embedding": embedding,
                     "x": X[: len(embedding), 0], "y": X[: len(embedding), 1]})  # fmt: skip


@pytest.mark.parametrize("kind", ["list", "fixed_size_list"])
def test_parquet_a_column_of_vectors_in_batches(tmp_path: Path, kind: str) -> None:
    values = pa.array(X.ravel(), pa.float32())
    if kind == "list":
        column = pa.ListArray.from_arrays(pa.array(np.arange(0, 104 * 4, 4), pa.int32()), values)
    else:
        column = pa.FixedSizeListArray.from_arrays(values, 4)
    path = tmp_path / "x.parquet"
    pq.write_table(_table(column), path, row_group_size=40)
    batches, total = rows(path, columns="embedding", batch_rows=25)
    assert total == 103 and max(len(b) for b in batches) <= 25
    np.testing.assert_array_equal(np.concatenate(batches), X)
    # Numeric columns, one dimension each, in the order given.
    picked, _ = rows(path, columns=["y", "x"])
    np.testing.assert_array_equal(np.concatenate(picked), X[:, [1, 0]])
    with pytest.raises(SourceError, match="must be the only column"):
        next(open_source(path).arrays)  # every column: the lists beside numbers
    with pytest.raises(SourceError, match="no column 'vectors'"):
        open_source(path, columns="vectors")


def test_parquet_and_arrow_refuse_nulls_ragged_lists_and_text(tmp_path: Path) -> None:
    cases = {
        "nulls": (pa.table({"x": pa.array([1.0, None, 3.0])}), "has 1 nulls"),
        "ragged": (pa.table({"v": pa.array([[1.0, 2.0], [3.0]])}), "different lengths"),
        "text": (pa.table({"s": pa.array(["a", "b"])}), "not numbers"),
        "text lists": (pa.table({"v": pa.array([["a"], ["b"]])}), "not lists of numbers"),
    }
    for name, (table, message) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path)
        with pytest.raises(SourceError, match=message):
            next(open_source(path).arrays)


@pytest.mark.parametrize("layout", ["file", "stream", "feather"])
def test_arrow_ipc_files_and_streams(tmp_path: Path, layout: str) -> None:
    table = pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "d": X[:, 3]})
    path = tmp_path / ("x.feather" if layout == "feather" else "x.arrow")
    if layout == "feather":
        feather.write_feather(table, path, chunksize=30)
    else:
        writer_of = pa.ipc.new_file if layout == "file" else pa.ipc.new_stream
        with pa.OSFile(str(path), "wb") as sink, writer_of(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=30):
                writer.write_batch(batch)
    batches, total = rows(path)
    assert total == (None if layout == "stream" else 103)
    assert [len(b) for b in batches] == [30, 30, 30, 13]
    np.testing.assert_array_equal(np.concatenate(batches), X)


def test_without_pyarrow_a_parquet_file_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"x": [1.0]}), path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(SourceError, match=r"pip install 'nmbatch-client\[arrow\]'"):
        open_source(path)


def drive(operation: Any, n_samples_before: int = 0) -> tuple[Any, list[tuple[str, np.ndarray]]]:
    """Run a push operation against made-up answers: (result, [(key, rows) per request])."""
    sent: list[tuple[str, np.ndarray]] = []
    held = n_samples_before
    step = next(operation)
    while True:
        assert isinstance(step, Call) and step.path == "/samples"
        assert step.content is not None
        chunk = np.load(io.BytesIO(step.content))
        sent.append((step.headers["idempotency-key"], chunk))
        held += len(chunk)
        answer = Answer(202, {}, json.dumps({"accepted": len(chunk), "n_samples": held}).encode())
        try:
            step = operation.send(answer)
        except StopIteration as done:
            return done.value, sent


def test_a_push_of_batches_keys_each_chunk_by_its_rows_in_the_whole_source() -> None:
    seen: list[tuple[int, int | None]] = []

    def batches() -> Iterator[np.ndarray]:
        yield X[:7]
        yield X[7:7]  # an empty batch is skipped
        yield X[7:20]

    operation = push_operation(batches(), Limits(max_vectors=5), idempotency_key="k",
                               progress=lambda done, total: seen.append((done, total)))  # fmt: skip
    result, sent = drive(operation)
    assert [key for key, _ in sent] == [
        "k:0-5", "k:5-7", "k:7-12", "k:12-17", "k:17-20",
    ]  # fmt: skip
    np.testing.assert_array_equal(np.concatenate([c for _, c in sent]), X[:20])
    assert (result.accepted, result.requests, result.n_samples) == (20, 5, 20)
    assert seen == [(5, None), (7, None), (12, None), (17, None), (20, None)]
    # A file: the total is known.
    seen.clear()
    result, _ = drive(push_operation(X, Limits(max_vectors=60), idempotency_key="k",
                                     progress=lambda done, total: seen.append((done, total))))
    assert seen == [(60, 103), (103, 103)] and result.requests == 2
    # An empty iterator sends nothing.
    empty = push_operation(iter([]), Limits())
    with pytest.raises(StopIteration) as done:
        next(empty)
    assert (done.value.value.accepted, done.value.value.n_samples) == (0, None)


def test_the_progress_bar() -> None:
    assert progress_bar(50, 200, 2.0, width=10) == "[##........]  25%  50/200 rows  25 rows/s"
    assert progress_bar(300, 200, 0.0, width=4) == "[####] 100%  300/200 rows  "
    assert progress_bar(1234, None, 1.0) == "pushed 1,234 rows  1,234 rows/s"
