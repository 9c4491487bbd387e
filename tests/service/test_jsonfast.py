"""The GIL-free JSON reader (``service.jsonfast``) gives exactly the orjson path's vectors.

For every body, ``parse_vectors`` must return the same ``float32`` matrix, bit for bit
(signed zeros included), as the reference: ``orjson.loads``, ``np.array`` and the float32
conversion. The fast reader may decline a body (None: the orjson path parses it), but
must never accept one the reference refuses or read a number differently.
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.service.jsonfast import parse_json_matrix
from nmbatch.service.parsing import JSON, parse_vectors
from nmbatch.service.problems import ProblemError


def reference(body: bytes) -> np.ndarray:
    return as_float32_matrix(np.array(orjson.loads(body)["vectors"]), dim=None, name="vectors")


def assert_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def check(body: bytes, fast_expected: bool | None = None) -> None:
    fast = parse_json_matrix(body)
    if fast_expected is not None:
        assert (fast is not None) == fast_expected, body[:200]
    parsed = parse_vectors(body, JSON, dim=None, max_vectors=10**6)
    assert_same_bits(parsed, reference(body))
    if fast is not None:  # also the float64 values, before any rounding to float32
        exact = np.array(orjson.loads(body)["vectors"], dtype=np.float64)
        np.testing.assert_array_equal(fast.view(np.uint64), exact.view(np.uint64))
        assert_same_bits(as_float32_matrix(fast, dim=None, name="vectors"), parsed)


def test_the_usual_body_takes_the_fast_path() -> None:
    X = np.random.default_rng(0).normal(0, 10, size=(1000, 128)).astype(np.float32)
    body = orjson.dumps({"vectors": X}, option=orjson.OPT_SERIALIZE_NUMPY)
    check(body, fast_expected=True)
    assert_same_bits(parse_vectors(body, JSON, dim=128, max_vectors=1000), X)


@pytest.mark.parametrize(
    ("numbers", "fast"),
    [
        ("-0, -0.0, 0, 0.0, -0e5, 0E-7", True),  # '-0' is the integer 0: +0.0
        ("1, -2, 3.5, 1e5, 1E+2, 2.5e-3, 1e22, 1e-22", True),
        ("0.1, 0.2, 0.3, 123456.789, -0.000001, 3.4028234e20, 1.17549435e-14", True),
        ("3.4028234e38, 1.17549435e-38", False),  # |E| > 22: orjson decides
        ("9007199254740992, -9007199254740992", True),  # 2**53: exact
        ("9007199254740993, 1", False),  # 2**53 + 1: not exact, orjson decides
        ("1e23, 2", False),
        ("2.2250738585072014e-308, 5e-324", False),
        ("0.30000000000000004, 1", False),  # 17 significant digits
        ("123456789012345678901234567890, 1", False),
        ("1.00000000000000000000, 1", False),  # long fractions: orjson decides
    ],
)
def test_numbers(numbers: str, fast: bool) -> None:
    check(f'{{"vectors": [[{numbers}]]}}'.encode(), fast_expected=fast)


def test_integer_only_bodies_equal_the_int64_path() -> None:
    check(b'{"vectors": [[1, 2, 3], [16777217, -16777219, 0]]}', fast_expected=True)


@pytest.mark.parametrize(
    "body",
    [
        b' \t\r\n{ "vectors" :\n[ [ 1 , 2 ] ,\t[3,4] ] }\n ',
        b'{"vectors":[[1,2],[3,4]]}',
    ],
)
def test_json_whitespace_anywhere(body: bytes) -> None:
    check(body, fast_expected=True)


@pytest.mark.parametrize(
    "body",
    [
        b'{"vectors": [[1, 2], [3]]}',  # ragged
        b'{"vectors": [[]]}',
        b'{"vectors": []}',
        b'{"vectors": [1, 2]}',
        b'{"vectors": [[[1]]]}',
        b'{"vectors": [[1, true]]}',
        b'{"vectors": [[1, null]]}',
        b'{"vectors": [["1"]]}',
        b'{"vectors": [[01]]}',
        b'{"vectors": [[1.]]}',
        b'{"vectors": [[.5]]}',
        b'{"vectors": [[+1]]}',
        b'{"vectors": [[1e]]}',
        b'{"vectors": [[-]]}',
        b'{"vectors": [[NaN]]}',
        b'{"vectors": [[1, 2],]}',
        b'{"vectors": [[1, 2]], "extra": 1}',
        b'{"vectors": [[1]]} x',
        b'{"vector\\u0073": [[1]]}',
        b"[[1, 2]]",
        b"",
    ],
)
def test_other_bodies_are_left_to_orjson(body: bytes) -> None:
    assert parse_json_matrix(body) is None
    try:
        expected: object = reference(body)
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        expected = ProblemError
    try:
        got: object = parse_vectors(body, JSON, dim=None, max_vectors=100)
    except ProblemError:
        got = ProblemError
    if expected is ProblemError or got is ProblemError:
        assert got is ProblemError  # refused, as by the reference (which problem: test_parsing)
    else:
        assert isinstance(got, np.ndarray) and isinstance(expected, np.ndarray)
        assert_same_bits(got, expected)


finite64 = st.floats(allow_nan=False, allow_infinity=False, width=64)
finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=200, deadline=None)
@given(X=arrays(np.float32, st.tuples(st.integers(1, 5), st.integers(1, 6)), elements=finite32))
def test_float32_arrays_as_orjson_writes_them(X: np.ndarray) -> None:
    check(orjson.dumps({"vectors": X}, option=orjson.OPT_SERIALIZE_NUMPY))


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 4).flatmap(
        lambda d: st.lists(
            st.lists(st.one_of(finite64, st.integers(-(2**60), 2**60)), min_size=d, max_size=d),
            min_size=1,
            max_size=4,
        )
    ),
    indent=st.sampled_from([None, 1]),
)
def test_python_floats_and_ints_as_json_writes_them(rows: list, indent: int | None) -> None:
    body = json.dumps({"vectors": rows}, indent=indent).encode()
    try:
        expected = reference(body)
    except ValueError:  # beyond float32: refused either way
        with pytest.raises(ProblemError):
            parse_vectors(body, JSON, dim=None, max_vectors=100)
        return
    assert_same_bits(parse_vectors(body, JSON, dim=None, max_vectors=100), expected)
