"""Body and query parsing: every accepted form gives the exact float32 matrix, every bad
input a problem naming its fault (no HTTP involved)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from nmbatch.service.parsing import parse_query_vector, parse_vectors
from nmbatch.service.problems import ProblemError
from tests.testkit import npy_bytes, pickled_object_npy


def parse(body: bytes, content_type: str, dim: int | None = None, max_vectors: int = 1000):
    return parse_vectors(body, content_type, dim=dim, max_vectors=max_vectors)


def test_json_vectors_become_the_same_float32_matrix() -> None:
    X = parse(b'{"vectors": [[1, 2.5, -3], [0.1, 0, 1e3]]}', "application/json")
    expected = np.array([[1, 2.5, -3], [0.1, 0, 1e3]], dtype=np.float32)
    assert X.dtype == np.float32 and X.flags.c_contiguous
    np.testing.assert_array_equal(X, expected)


def test_content_type_parameters_are_ignored() -> None:
    X = parse(b'{"vectors": [[1, 2]]}', "Application/JSON; charset=utf-8")
    np.testing.assert_array_equal(X, [[1, 2]])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32, np.uint8, ">f8"])
def test_npy_of_any_real_dtype_becomes_float32(dtype: str) -> None:
    A = np.arange(12).reshape(4, 3).astype(dtype)
    X = parse(npy_bytes(A), "application/x-npy")
    np.testing.assert_array_equal(X, A.astype(np.float32))


def test_fortran_ordered_npy_keeps_its_rows() -> None:
    A = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    np.testing.assert_array_equal(parse(npy_bytes(A), "application/x-npy"), A)


def test_octet_stream_is_little_endian_float32_rows() -> None:
    A = np.array([[1.5, -2.0], [3.25, 4.0], [0.0, 1.0]], dtype="<f4")
    np.testing.assert_array_equal(parse(A.tobytes(), "application/octet-stream", dim=2), A)


def npy_with_header(shape: tuple[int, ...], data: bytes, descr: str = "<f4") -> bytes:
    out = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + data


J, N, B = "application/json", "application/x-npy", "application/octet-stream"

BAD_BODIES = [
    # (case, body, content type, dim, status, problem slug)
    ("invalid json", b'{"vectors": [[1, 2]', J, None, 400, "malformed-body"),
    ("NaN literal", b'{"vectors": [[NaN, 1]]}', J, None, 400, "malformed-body"),
    ("not an object", b"[[1, 2]]", J, None, 422, "not-a-matrix"),
    ("no vectors", b'{"data": [[1]]}', J, None, 422, "not-a-matrix"),
    ("extra member", b'{"vectors": [[1]], "x": 1}', J, None, 422, "unknown-member"),
    ("vectors not a list", b'{"vectors": 3}', J, None, 422, "not-a-matrix"),
    ("ragged", b'{"vectors": [[1, 2], [3]]}', J, None, 422, "not-a-matrix"),
    ("one flat vector", b'{"vectors": [1, 2]}', J, None, 422, "not-a-matrix"),
    ("3-D", b'{"vectors": [[[1, 2]]]}', J, None, 422, "not-a-matrix"),
    ("empty list", b'{"vectors": []}', J, None, 422, "empty"),
    ("empty vector", b'{"vectors": [[]]}', J, None, 422, "empty"),
    ("string", b'{"vectors": [[1, "2"]]}', J, None, 422, "non-numeric"),
    ("null", b'{"vectors": [[1, null]]}', J, None, 422, "non-numeric"),
    ("boolean", b'{"vectors": [[1, true]]}', J, None, 422, "non-numeric"),
    ("object", b'{"vectors": [[1, {}]]}', J, None, 422, "non-numeric"),
    ("wrong dim", b'{"vectors": [[1, 2, 3]]}', J, 2, 422, "wrong-dimension"),
    ("float32 overflow", b'{"vectors": [[1e39, 1]]}', J, None, 422, "non-finite"),
    ("a double overflow", b'{"vectors": [[1e999, 1]]}', J, None, 422, "non-finite"),
    ("too many", b'{"vectors": [[1], [2], [3]]}', J, None, 413, "too-many-vectors"),
    ("no npy", b"\x93NUMPY garbage", N, None, 400, "malformed-body"),
    ("npy is json", b'{"vectors": [[1]]}', N, None, 400, "malformed-body"),
    ("npy NaN", npy_bytes(np.array([[1.0, np.nan]])), N, None, 422, "non-finite"),
    ("npy inf", npy_bytes(np.array([[np.inf, 1.0]])), N, None, 422, "non-finite"),
    ("npy 1-D", npy_bytes(np.arange(3.0)), N, None, 422, "not-a-matrix"),
    ("npy 3-D", npy_bytes(np.zeros((1, 2, 2))), N, None, 422, "not-a-matrix"),
    ("npy empty", npy_bytes(np.zeros((0, 2))), N, None, 422, "empty"),
    ("npy bool", npy_bytes(np.ones((2, 2), bool)), N, None, 422, "non-numeric"),
    ("npy complex", npy_bytes(np.ones((1, 2), complex)), N, None, 422, "non-numeric"),
    ("npy strings", npy_bytes(np.array([["a", "b"]])), N, None, 422, "non-numeric"),
    ("npy wrong dim", npy_bytes(np.zeros((2, 3))), N, 2, 422, "wrong-dimension"),
    ("npy too many", npy_bytes(np.zeros((1001, 1))), N, None, 413, "too-many-vectors"),
    ("npy truncated", npy_bytes(np.zeros((4, 2)))[:-3], N, None, 400, "malformed-body"),
    ("npy lies about its shape", npy_with_header((4, 10**11), b"\0" * 16), N, None, 400,
     "malformed-body"),
    ("octet ragged", b"\0" * 12, B, 2, 422, "not-a-matrix"),
    ("octet NaN", np.array([np.nan, 1], "<f4").tobytes(), B, 2, 422, "non-finite"),
    ("octet empty", b"", B, 2, 422, "empty"),
    ("octet, dim unknown", b"\0" * 8, B, None, 409, "dimension-unknown"),
    ("text", b"1,2,3", "text/csv", None, 415, "unsupported-media-type"),
    ("no content type", b'{"vectors": [[1]]}', "", None, 415, "unsupported-media-type"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "content_type", "dim", "status", "slug"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
def test_bad_body_is_a_problem_naming_the_fault(
    body: bytes, content_type: str, dim: int | None, status: int, slug: str
) -> None:
    max_vectors = 2 if slug == "too-many-vectors" and content_type == J else 1000
    with pytest.raises(ProblemError) as info:
        parse(body, content_type, dim=dim, max_vectors=max_vectors)
    assert (info.value.status, info.value.slug) == (status, slug)
    assert info.value.detail


def test_pickled_object_array_is_refused_without_unpickling() -> None:
    with pytest.raises(ProblemError) as info:
        parse(pickled_object_npy(), "application/x-npy")
    assert info.value.status == 422 and info.value.slug == "non-numeric"


def test_query_vector_is_parsed_as_one_row() -> None:
    np.testing.assert_array_equal(parse_query_vector("1, -2.5,3e1", dim=3), [[1, -2.5, 30]])


@pytest.mark.parametrize(
    ("text", "slug"),
    [("1,a", "non-numeric"), ("", "not-a-matrix"), ("1,,2", "not-a-matrix"),
     ("1,nan", "non-finite"), ("1,inf", "non-finite"), ("1,2,3", "wrong-dimension")],
)  # fmt: skip
def test_bad_query_vector_is_a_422_problem(text: str, slug: str) -> None:
    with pytest.raises(ProblemError) as info:
        parse_query_vector(text, dim=2)
    assert (info.value.status, info.value.slug) == (422, slug)
