"""Parameters, parameter and input checks and seeding of ``NestedMiniBatchKMeans``.

``ParamsMixin`` is scikit-learn's ``BaseEstimator`` parameter protocol (``get_params``,
``set_params``, ``__repr__``), written here so the engine does not import scikit-learn.

The estimator (``engine/estimator.py``) calls these before it touches its store, so a
``ValueError`` leaves it exactly as it was. The messages follow scikit-learn's, so its
estimator checks recognise them; nothing here imports scikit-learn.
"""

from __future__ import annotations

import inspect
import numbers
import sys
from typing import Any

import numpy as np

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.algorithms import ALGORITHMS
from nmbatch.engine.algorithms.bounds import check_bound_mode
from nmbatch.engine.retention import check_catch_up, check_retention
from nmbatch.engine.threads import check_threads

__all__ = [
    "INIT_METHODS",
    "ParamsMixin",
    "check_X",
    "check_backend",
    "check_callback",
    "check_init",
    "check_params",
    "not_fitted_error",
    "seed_sequence",
    "spawn_seeds",
]

INIT_METHODS = ("k-means++", "first")


class _NotFittedError(ValueError, AttributeError):
    """Raised by ``predict``, ``transform`` and ``score`` before the model is fitted.

    Used when scikit-learn is not loaded; otherwise scikit-learn's ``NotFittedError``
    (also a ``ValueError`` and ``AttributeError``) is raised, which is what its checks
    and its users catch.
    """


class ParamsMixin:
    """``get_params``, ``set_params`` and ``__repr__`` from the ``__init__`` signature."""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return sorted(
            name
            for name, p in signature.parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Parameters of the estimator by name (``deep`` is accepted; none are estimators)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> Any:
        """Set parameters by name and return ``self``; values are checked by ``fit``."""
        valid = self._get_param_names()
        for name in params:
            if name not in valid:
                raise ValueError(
                    f"Invalid parameter {name!r} for estimator {type(self).__name__}. "
                    f"Valid parameters are: {valid!r}."
                )
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {
            name: p.default
            for name, p in inspect.signature(type(self).__init__).parameters.items()
            if name != "self"
        }
        shown = []
        for name, value in self.get_params().items():
            default = defaults[name]
            is_default = (
                not isinstance(value, np.ndarray)
                and type(value) is type(default)
                and value == default
            )
            if not is_default:
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


def not_fitted_error(message: str) -> Exception:
    """scikit-learn's ``NotFittedError(message)`` if it is loaded, else ``_NotFittedError``."""
    exceptions = sys.modules.get("sklearn.exceptions")
    cls = getattr(exceptions, "NotFittedError", None) or _NotFittedError
    return cls(message)


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


def _is_int_at_least_1(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def check_params(params: dict[str, Any]) -> None:
    """Raise ``ValueError`` for a parameter value ``fit`` cannot use.

    ``params`` is the estimator's ``get_params()``.
    """
    k = params["n_clusters"]
    if not _is_int_at_least_1(k):
        raise ValueError(f"n_clusters must be an int >= 1, got {k!r}")
    rho = params["rho"]
    if (
        not isinstance(rho, numbers.Real)
        or isinstance(rho, bool)
        or not np.isfinite(rho)
        or rho <= 0
    ):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    for name in ("batch_size", "max_iter"):
        if not _is_int_at_least_1(params[name]):
            raise ValueError(f"{name} must be an int >= 1, got {params[name]!r}")
    if not isinstance(params.get("relocate_empty", True), bool):
        raise ValueError(f"relocate_empty must be a bool, got {params['relocate_empty']!r}")
    swap = params.get("swap_clusters", "auto")
    if not (isinstance(swap, bool) or swap == "auto"):
        raise ValueError(f'swap_clusters must be "auto" or a bool, got {swap!r}')
    check_catch_up(params.get("catch_up", "auto"))
    check_bound_mode(params.get("bounds", "auto"))
    check_threads(params.get("n_threads"))
    check_backend(params)
    algorithm = params["algorithm"]
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    init = params["init"]
    if isinstance(init, str) and init not in INIT_METHODS:
        raise ValueError(
            f"init must be one of {INIT_METHODS} or an array of shape "
            f"(n_clusters, n_features), got {init!r}"
        )
    check_callback(params["callback"])
    check_retention(params["retention"], params["max_samples"], params["max_age_seconds"], k)
    if params["retention"] != "all" and algorithm == "mbatch":
        raise ValueError(
            f"retention {params['retention']!r} needs an algorithm that forgets exactly; "
            "mbatch keeps running averages of every assignment (use mbatch.remove)"
        )


def check_backend(params: dict[str, Any]) -> None:
    """Raise ``ValueError`` for a bad ``backend``, ``n_shards`` or ``ray_address``."""
    backend = params.get("backend", "local")
    if backend not in ("local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    if not _is_int_at_least_1(params.get("n_shards", 1)):
        raise ValueError(f"n_shards must be an int >= 1, got {params['n_shards']!r}")
    address = params.get("ray_address")
    if address is not None and not isinstance(address, str):
        raise ValueError(f"ray_address must be None or a str, got {address!r}")
    if backend == "ray" and (params["algorithm"] != "nmbatch" or params["retention"] != "all"):
        raise ValueError("backend='ray' runs algorithm='nmbatch' with retention='all' only")


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
