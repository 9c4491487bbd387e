"""Hostile bodies and queries: each is refused with a problem naming its fault, no 5xx,
and the sample log (entries, counter, dimension) is unchanged.

Also a property test of the parser itself: whatever the bytes, ``parse_vectors`` returns a
valid matrix or raises ``ProblemError``, never anything else.
"""

from __future__ import annotations

import math
import pickle
import struct
from collections.abc import Iterator

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmbatch.service.main import create_app
from nmbatch.service.parsing import parse_vectors
from nmbatch.service.problems import ProblemError
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_problem,
    log_state,
    npy_bytes,
    pickled_object_npy,
    wait_until,
)

J, N, B = "application/json", "application/x-npy", "application/octet-stream"
MAX_VECTORS = 1000
MAX_DIM = 64
MAX_BODY = 256 * 1024


def npy_header(shape: object, descr: str = "<f4", fortran: bool = False, version=(1, 0)) -> bytes:
    """A hand-made .npy preamble and header (any shape, even a lying one)."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode("latin-1")
    size_format = "<H" if version == (1, 0) else "<I"
    preamble = b"\x93NUMPY" + bytes(version)
    total = len(preamble) + struct.calcsize(size_format) + len(header) + 1
    header += b" " * ((64 - total % 64) % 64) + b"\n"
    return preamble + struct.pack(size_format, len(header)) + header


def nested(depth: int) -> bytes:
    return b'{"vectors": ' + b"[" * depth + b"1" + b"]" * depth + b"}"


# (case, body, content type, status, problem slug); the model has dimension 2 and
# MAX_VECTORS, MAX_DIM and MAX_BODY as limits.
HOSTILE = [
    # dimensions
    ("huge dimension (json)", b'{"vectors": [[' + b"1," * 100_000 + b"1]]}", J, 422,
     "wrong-dimension"),
    ("huge dimension (npy header)", npy_header((1, 10**9)) + b"\0" * 16, N, 422,
     "wrong-dimension"),
    ("zero dimension", npy_header((3, 0)), N, 422, "wrong-dimension"),
    ("zero vectors", npy_header((0, 2)), N, 422, "empty"),
    # counts
    ("huge count (npy header)", npy_header((10**12, 2)) + b"\0" * 16, N, 413,
     "too-many-vectors"),
    ("huge count (json)", b'{"vectors": [' + b"[1,2]," * 5000 + b"[1,2]]}", J, 413,
     "too-many-vectors"),
    ("huge count (raw)", b"\0" * 8 * (MAX_VECTORS + 1), B, 413, "too-many-vectors"),
    ("npy shape product overflows int64", npy_header((2**62, 2**62)) + b"\0" * 8, N, 413,
     "too-many-vectors"),
    ("negative npy shape", npy_header((-1, -2)) + b"\0" * 8, N, 400, "malformed-body"),
    ("npy shape of floats", npy_header((1.5, 2)) + b"\0" * 8, N, 400, "malformed-body"),
    # nesting
    ("100k nested brackets", nested(100_000), J, 413, "too-many-vectors"),
    ("1k nested brackets", nested(1_000), J, 422, "not-a-matrix"),
    ("2k nested brackets, unclosed", b"[" * 2000, J, 413, "too-many-vectors"),
    ("nested objects", b'{"vectors": ' + b'{"a":' * 900 + b"1" + b"}" * 900 + b"}", J, 422,
     "not-a-matrix"),
    # encodings
    ("non-UTF-8 bytes in json", b'{"vectors": [[1, 2]], "\xff\xfe": 1}', J, 400,
     "malformed-body"),
    ("UTF-16 json", '{"vectors": [[1, 2]]}'.encode("utf-16"), J, 400, "malformed-body"),
    ("lone surrogate escape", b'{"vectors": [["\\ud800"]]}', J, 400, "malformed-body"),
    ("NUL bytes", b"\0" * 64, J, 400, "malformed-body"),
    ("number too large for float64", b'{"vectors": [[1e999, 1]]}', J, 422, "non-finite"),
    ("number too large for float32", b'{"vectors": [[1e300, 1]]}', J, 422, "non-finite"),
    ("integer beyond 64 bits", b'{"vectors": [[1, ' + b"9" * 400 + b"]]}", J, 422,
     "non-finite"),
    ("empty body", b"", J, 400, "malformed-body"),
    # npy attacks
    ("npy of objects (pickle inside)", pickled_object_npy(1.0), N, 422, "non-numeric"),
    ("a bare pickle", pickle.dumps(np.zeros((2, 2))), N, 400, "malformed-body"),
    ("truncated npy data", npy_bytes(np.zeros((4, 2)))[:-3], N, 400, "malformed-body"),
    ("truncated npy header", npy_bytes(np.zeros((4, 2)))[:30], N, 400, "malformed-body"),
    ("npy magic only", b"\x93NUMPY", N, 400, "malformed-body"),
    ("npy header that breaks numpy's tokenizer", b"\x93NUMPY\x01\x00\x03\x00{(\n",
     N, 400, "malformed-body"),
    ("npy version 3.0", npy_header((1, 2), version=(3, 0)) + b"\0" * 8, N, 400,
     "malformed-body"),
    ("npy header of 60 KB", b"\x93NUMPY\x02\x00" + struct.pack("<I", 60_000) + b" " * 60_000,
     N, 400, "malformed-body"),
    ("npy with trailing bytes", npy_bytes(np.zeros((1, 2))) + b"junk", N, 400,
     "malformed-body"),
    ("npy structured dtype", npy_bytes(np.zeros((1, 2), dtype=[("a", "<f4")])), N, 422,
     "non-numeric"),
    ("npy datetime", npy_bytes(np.zeros((1, 2), dtype="M8[s]")), N, 422, "non-numeric"),
    ("npy unicode", npy_bytes(np.array([["1", "2"]])), N, 422, "non-numeric"),
    ("npy void", npy_header((1, 2), descr="|V4") + b"\0" * 8, N, 422, "non-numeric"),
    ("npy float16 inf", npy_bytes(np.float16([[np.inf, 1]])), N, 422, "non-finite"),
    # raw float32
    ("raw, not a multiple of 4*dim", b"\0" * 12, B, 422, "not-a-matrix"),
    ("raw, 3 bytes", b"\0" * 3, B, 422, "not-a-matrix"),
    ("raw NaN", np.float32([np.nan, 1]).tobytes(), B, 422, "non-finite"),
    # media types
    ("multipart", b"--x\r\n\r\n1,2\r\n--x--", "multipart/form-data; boundary=x", 415,
     "unsupported-media-type"),
    ("no content type", b'{"vectors": [[1, 2]]}', "", 415, "unsupported-media-type"),
    # size
    ("body over the limit", b'{"vectors": [[1, 2]]}' + b" " * MAX_BODY, J, 413,
     "body-too-large"),
]  # fmt: skip


@pytest.fixture
def hostile_client(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> Iterator[TestClient]:
    """The app with small limits, k = 1 and centroids of dimension 2 from one sample."""
    settings = make_settings(k=1, max_vectors=MAX_VECTORS, max_dim=MAX_DIM, max_body_bytes=MAX_BODY)
    with TestClient(create_app(settings)) as client:
        assert client.post("/samples", json={"vectors": [[1.0, 2.0]]}).status_code == 202
        wait_until(lambda: client.get("/centroids").status_code == 200, what="centroids")
        yield client


@pytest.mark.parametrize(
    ("body", "content_type", "status", "slug"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_body_is_refused_and_changes_nothing(
    hostile_client: TestClient,
    redis_client: redis.Redis,
    model_name: str,
    body: bytes,
    content_type: str,
    status: int,
    slug: str,
) -> None:
    before = log_state(redis_client, model_name)
    headers = {"content-type": content_type} if content_type else {}
    for path in ("/samples", "/assign"):
        response = hostile_client.post(path, content=body, headers=headers)
        assert_problem(response, status, slug)
    assert log_state(redis_client, model_name) == before == (1, 1, b"2")


def test_a_huge_first_batch_cannot_fix_a_huge_dimension(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(max_dim=MAX_DIM, max_body_bytes=16 * 1024 * 1024)
    with TestClient(create_app(settings)) as client:
        cases = [
            (npy_header((1, 10**9)) + b"\0" * 4, N),  # refused from the header alone
            (npy_bytes(np.zeros((2, MAX_DIM + 1))), N),
            (b'{"vectors": [[' + b"0," * MAX_DIM + b"0]]}", J),
        ]
        for body, content_type in cases:
            response = client.post("/samples", content=body, headers={"content-type": content_type})
            problem = assert_problem(response, 422, "dimension-too-large")
            assert problem["max_dim"] == MAX_DIM
        assert log_state(redis_client, model_name) == (0, 0, None)
        ok = client.post("/samples", content=npy_bytes(np.ones((2, MAX_DIM))),
                         headers={"content-type": N})  # fmt: skip
        assert ok.status_code == 202
        assert log_state(redis_client, model_name) == (1, 2, str(MAX_DIM).encode())


def test_a_configured_dimension_above_max_dim_is_allowed(
    make_settings: SettingsFactory,
) -> None:
    with TestClient(create_app(make_settings(dim=100, max_dim=10))) as client:
        response = client.post("/samples", content=npy_bytes(np.ones((1, 100))),
                               headers={"content-type": N})  # fmt: skip
        assert response.status_code == 202


HOSTILE_QUERIES = [
    ("5000 coordinates", "vector=" + ",".join(["1"] * 5000), 422, "wrong-dimension"),
    ("percent-encoded non-UTF-8", "vector=%FF%FE", 422, "non-numeric"),
    ("NUL", "vector=1%00,2", 422, "non-numeric"),
    ("overflow", "vector=1e999,1", 422, "non-finite"),
    ("float32 overflow", "vector=1e300,1", 422, "non-finite"),
    ("nan", "vector=nan,1", 422, "non-finite"),
    ("empty", "vector=", 422, "not-a-matrix"),
    ("missing", "", 422, "invalid-request"),
    ("brackets", "vector=[[1,2]]", 422, "non-numeric"),
]


@pytest.mark.parametrize(
    ("query", "status", "slug"),
    [case[1:] for case in HOSTILE_QUERIES],
    ids=[case[0] for case in HOSTILE_QUERIES],
)
def test_hostile_query_is_a_problem(
    hostile_client: TestClient, query: str, status: int, slug: str
) -> None:
    assert_problem(hostile_client.get(f"/assign?{query}"), status, slug)


# -- the parser against arbitrary bytes --------------------------------------------------------
def _mutated_npy() -> st.SearchStrategy[bytes]:
    valid = npy_bytes(np.arange(12, dtype=np.float32).reshape(6, 2))

    def mutate(data: bytes, position: int, value: int, cut: int) -> bytes:
        out = bytearray(data[:cut])
        if out:
            out[position % len(out)] = value
        return bytes(out)

    return st.builds(
        mutate,
        st.just(valid),
        st.integers(0, len(valid) - 1),
        st.integers(0, 255),
        st.integers(0, len(valid)),
    )


def _npy_headers() -> st.SearchStrategy[bytes]:
    """Headers with any shape and dtype; the data has the length they promise or not."""
    dims = st.one_of(st.integers(-2, 3), st.integers(-(2**63), 2**64))
    shapes = st.one_of(st.tuples(dims, dims), st.tuples(dims), st.tuples(dims, dims, dims))
    descrs = st.sampled_from(["<f4", ">f8", "|b1", "<c8", "|O", "<U3", "|V8", "<M8[s]", "|u1"])

    def build(shape: tuple[int, ...], descr: str, fortran: bool, data: bytes | None) -> bytes:
        if data is None:  # exactly the promised length, when that is small
            size = abs(math.prod(shape)) * np.dtype(descr).itemsize
            data = b"\0" * size if size <= 4096 else b""
        return npy_header(shape, descr, fortran) + data

    return st.builds(
        build, shapes, descrs, st.booleans(), st.one_of(st.none(), st.binary(max_size=64))
    )


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def check_parse(body: bytes, content_type: str, dim: int | None) -> None:
    """``parse_vectors`` gives a valid matrix or a 4xx ProblemError, nothing else."""
    try:
        X = parse_vectors(body, content_type, dim=dim, max_vectors=100, max_dim=MAX_DIM)
    except ProblemError as exc:
        assert 400 <= exc.status < 500 and exc.detail
        return
    assert X.dtype == np.float32 and X.ndim == 2 and X.flags.c_contiguous
    assert 1 <= X.shape[0] <= 100 and 1 <= X.shape[1] <= MAX_DIM and np.isfinite(X).all()
    assert dim is None or X.shape[1] == dim


@PROPERTY_SETTINGS
@given(
    body=st.one_of(st.binary(max_size=256), _mutated_npy(), st.text(max_size=64).map(str.encode)),
    content_type=st.sampled_from([J, N, B]),
    dim=st.sampled_from([None, 2]),
)
def test_parser_returns_a_matrix_or_a_problem_for_any_bytes(
    body: bytes, content_type: str, dim: int | None
) -> None:
    check_parse(body, content_type, dim)


@PROPERTY_SETTINGS
@given(body=_npy_headers(), dim=st.sampled_from([None, 2]))
def test_parser_returns_a_matrix_or_a_problem_for_any_npy_header(
    body: bytes, dim: int | None
) -> None:
    check_parse(body, N, dim)
