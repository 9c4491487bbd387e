"""Parameter constraints, parameter and input checks and seeding of ``NestedMiniBatchKMeans``.

``PARAMETER_CONSTRAINTS`` is the estimator's ``_parameter_constraints``: scikit-learn's
``_fit_context`` checks every parameter against it (``InvalidParameterError``, a
``ValueError`` and ``TypeError``, with scikit-learn's message) before ``fit`` or a first
``partial_fit`` touches the store. ``check_param_combinations`` then checks what one
parameter's constraint cannot see: the retention settings against ``n_clusters``, the
algorithms each retention and each backend can run. So a ``ValueError`` leaves the
estimator exactly as it was.
"""

from __future__ import annotations

import numbers
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.algorithms import ALGORITHMS
from nmbatch.engine.algorithms.bounds import BOUND_MODES
from nmbatch.engine.backend import BACKEND_NAMES, RayBackend, ray_backend
from nmbatch.engine.metric import METRICS
from nmbatch.engine.retention import RETENTIONS, check_retention
from nmbatch.engine.seeding import SEEDINGS

__all__ = [
    "INIT_METHODS",
    "PARAMETER_CONSTRAINTS",
    "check_X",
    "check_callback",
    "check_init",
    "check_param_combinations",
    "seed_sequence",
    "spawn_seeds",
]

INIT_METHODS = SEEDINGS


class _Ints(Interval):
    """``Interval(Integral, ...)`` without ``bool`` (``True`` is not a count of 1)."""

    def is_satisfied_by(self, val: object) -> bool:
        return not isinstance(val, bool | np.bool_) and super().is_satisfied_by(val)


def _at_least(low: int) -> _Ints:
    return _Ints(Integral, low, None, closed="left")


PARAMETER_CONSTRAINTS: dict[str, list[Any]] = {
    "n_clusters": [_at_least(1)],
    "metric": [StrOptions(set(METRICS))],
    "init": [StrOptions(set(INIT_METHODS)), "array-like"],
    "max_iter": [_at_least(1)],
    "batch_size": [_at_least(1)],
    # Any int >= 0 (a SeedSequence entropy), a RandomState or a Generator.
    "random_state": [_at_least(0), np.random.RandomState, np.random.Generator, None],
    "rho": [Interval(Real, 0, None, closed="neither")],
    "callback": [callable, None],
    "algorithm": [StrOptions(set(ALGORITHMS))],
    "bounds": [StrOptions(set(BOUND_MODES))],
    "relocate_empty": ["boolean"],
    "swap_clusters": [StrOptions({"auto"}), "boolean"],
    "retention": [StrOptions(set(RETENTIONS))],
    "max_samples": [_at_least(1), None],
    "max_age_seconds": [Interval(Real, 0, None, closed="neither"), None],
    "catch_up": [StrOptions({"auto"}), _at_least(0)],
    "n_threads": [_at_least(1), None],
    "backend": [StrOptions(set(BACKEND_NAMES)), RayBackend, None],
}
"""The estimator's ``_parameter_constraints`` (scikit-learn's format)."""


def check_param_combinations(params: dict[str, Any]) -> None:
    """Raise ``ValueError`` for parameters that pass their constraints one by one but
    not together. ``params`` is the estimator's ``get_params()``."""
    k, algorithm, retention = params["n_clusters"], params["algorithm"], params["retention"]
    check_retention(retention, params["max_samples"], params["max_age_seconds"], k)
    if retention != "all" and algorithm == "mbatch":
        raise ValueError(
            f"retention {retention!r} needs an algorithm that forgets exactly; "
            "mbatch keeps running averages of every assignment (use mbatch.remove)"
        )
    if ray_backend(params["backend"]) is not None and (
        algorithm != "nmbatch" or retention != "all"
    ):
        raise ValueError("backend='ray' runs algorithm='nmbatch' with retention='all' only")


def _is_sparse(X: object) -> bool:
    """True for scipy.sparse matrices and arrays, recognised without importing scipy."""
    return type(X).__module__.startswith("scipy.sparse") or (
        hasattr(X, "tocsr") and hasattr(X, "nnz")
    )


def seed_sequence(random_state: object) -> np.random.SeedSequence:
    """One ``SeedSequence`` from ``random_state`` (int >= 0, None, RandomState, Generator).

    A ``RandomState`` or ``Generator`` is advanced by one draw, as scikit-learn does.
    """
    if random_state is None:
        return np.random.SeedSequence()
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(f"random_state must be a non-negative int, got {random_state}")
        return np.random.SeedSequence(int(random_state))
    if isinstance(random_state, np.random.RandomState):
        return np.random.SeedSequence(int(random_state.randint(np.iinfo(np.int32).max)))
    if isinstance(random_state, np.random.Generator):
        return np.random.SeedSequence(int(random_state.integers(2**63 - 1)))
    raise ValueError(
        "random_state must be None, a non-negative int, a numpy.random.RandomState or a "
        f"numpy.random.Generator, got {random_state!r}"
    )


def spawn_seeds(seq: np.random.SeedSequence, n: int) -> list[int]:
    """``n`` independent 63-bit integer seeds derived from ``seq``."""
    return [int(child.generate_state(1, np.uint64)[0] >> 1) for child in seq.spawn(n)]


def check_callback(callback: object) -> None:
    """Raise ``ValueError`` unless ``callback`` is None or callable."""
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be None or a callable, got {callback!r}")


def check_init(init: str | object, n_clusters: int, n_features: int) -> str | np.ndarray:
    """The ``init`` to hand to the engine: a method name or a ``(k, d)`` float32 array."""
    if isinstance(init, str):
        return init
    array = as_float32_matrix(init, name="init")
    expected = (int(n_clusters), n_features)
    if array.shape != expected:
        raise ValueError(f"init has shape {array.shape}, but (n_clusters, n_features) = {expected}")
    return array


def check_X(X: object, *, n_features: int | None, estimator: str) -> np.ndarray:
    """Return ``X`` as a C-contiguous ``(n, d)`` float32 array, or raise.

    ``n_features`` (the fitted ``n_features_in_``, or None on a first fit) is checked
    against ``d``; ``estimator`` is the class name the messages use. The numeric, shape
    and finiteness checks are ``as_float32_matrix``'s.
    """
    if _is_sparse(X):
        raise TypeError(
            "Sparse input is not supported by NestedMiniBatchKMeans; "
            "pass a dense array (X.toarray())."
        )
    try:
        A = np.asarray(X)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"X is not a numeric array: {exc}") from None
    if A.dtype == object:
        # Numbers stored as objects are accepted; anything else fails here with
        # numpy's TypeError ("float() argument must be a string or a real number").
        A = A.astype(np.float64)
    if np.issubdtype(A.dtype, np.complexfloating):
        raise ValueError("Complex data not supported: X must be real.")
    if A.ndim == 1:
        raise ValueError(
            f"Expected a 2-D array, got a 1-D array of shape {A.shape} instead. "
            "Reshape your data either using array.reshape(-1, 1) if it has a single "
            "feature or array.reshape(1, -1) if it contains a single sample."
        )
    if A.ndim == 2 and A.shape[1] == 0:
        raise ValueError(
            f"Found array with 0 feature(s) (shape={A.shape}) while a minimum of 1 is required."
        )
    if A.ndim == 2 and A.shape[0] == 0:
        raise ValueError(
            f"Found array with 0 sample(s) (shape={A.shape}) while a minimum of 1 is required."
        )
    if n_features is not None and A.ndim == 2 and A.shape[1] != n_features:
        raise ValueError(
            f"X has {A.shape[1]} features, but {estimator} is expecting "
            f"{n_features} features as input."
        )
    return as_float32_matrix(A)
