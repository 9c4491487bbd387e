"""Data sets of the benchmark: a ``.npz`` file, image patches, INFMNIST-like digits, blobs.

Every loader returns a :class:`Dataset` whose ``train`` and ``test`` are C-contiguous
``float32`` arrays. ``train`` is what the algorithms cluster; ``test`` is the validation
set on which the energy ``E_V`` is measured (the paper's protocol).

- ``load_npz``: any file with keys ``train`` and ``test`` (e.g. ``mnist.npz``, which
  ``mnist.fetch_mnist`` downloads and caches).
- ``make_patches``: 6x6x3 colour patches (``d = 108``) of scikit-learn's two sample
  photographs on a stride-2 grid (134,196 patches, 20,000 held out): an analogue of the
  paper's STL10P.
- ``make_infmnist``: 400,000 digits made from MNIST ``train`` by small random
  translations and elastic deformations (Simard et al. 2003; Loosli, Canu & Bottou 2007),
  deterministic from a seed, generated in chunks and cached as ``uint8`` outside the repo;
  validated on MNIST ``test``.
- ``make_blobs``: Gaussian blobs, for quick runs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "INFMNIST_VERSION",
    "Dataset",
    "default_cache_dir",
    "deform_digits",
    "load_npz",
    "make_blobs",
    "make_infmnist",
    "make_patches",
    "subsample",
]

# Bump when the generator changes, so that stale cache files are not reused.
INFMNIST_VERSION = 1


@dataclass(frozen=True)
class Dataset:
    """A training set to cluster and a validation set to measure ``E_V`` on.

    Attributes
    ----------
    name : str
    train : (n_train, d) float32, C-contiguous
    test : (n_test, d) float32, C-contiguous
    description : str
        One line saying where the data come from (for results.md).
    """

    name: str
    train: np.ndarray
    test: np.ndarray
    description: str

    @property
    def dim(self) -> int:
        return int(self.train.shape[1])


def _as_f32(A: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(A, dtype=np.float32)


def load_npz(path: str | os.PathLike[str], name: str | None = None) -> Dataset:
    """Load ``train`` and ``test`` (any numeric dtype, cast to float32) from an ``.npz``."""
    path = Path(path)
    with np.load(path) as f:
        missing = {"train", "test"} - set(f.files)
        if missing:
            raise ValueError(f"{path.name} lacks key(s) {sorted(missing)}; it has {f.files}")
        train, test = _as_f32(f["train"]), _as_f32(f["test"])
    if train.ndim != 2 or test.ndim != 2 or train.shape[1] != test.shape[1]:
        raise ValueError(f"train {train.shape} and test {test.shape} must be 2-D with equal d")
    return Dataset(
        name or path.stem, train, test, f"{path.name}: train {train.shape}, test {test.shape}"
    )


def make_patches(
    *, patch: int = 6, stride: int = 2, n_test: int = 20_000, seed: int = 0
) -> Dataset:
    """All ``patch x patch x 3`` patches of ``load_sample_images()`` on a ``stride`` grid.

    Each patch is flattened row, column, channel (``d = 3 patch^2``, raw 0-255 values).
    With the defaults: 2 x 211 x 318 = 134,196 patches, of which a random ``n_test``
    (seeded by ``seed``, independent of the benchmark seeds) are held out for validation.
    """
    from sklearn.datasets import load_sample_images

    pieces = []
    for img in load_sample_images().images:
        win = np.lib.stride_tricks.sliding_window_view(img, (patch, patch, 3))
        win = win[::stride, ::stride, 0]  # (rows, cols, patch, patch, 3)
        pieces.append(win.reshape(-1, patch * patch * 3))
    X = _as_f32(np.concatenate(pieces))
    order = np.random.default_rng(seed).permutation(X.shape[0])
    test, train = X[order[:n_test]], X[order[n_test:]]
    return Dataset(
        "patches",
        _as_f32(train),
        _as_f32(test),
        f"{patch}x{patch}x3 patches (stride {stride}) of sklearn's sample images: "
        f"{X.shape[0]} patches, {n_test} held out",
    )


def make_blobs(
    *, n_train: int = 20_000, n_test: int = 5_000, dim: int = 32, centers: int = 20,
    std: float = 4.0, seed: int = 0,
) -> Dataset:
    """Isotropic Gaussian blobs (``sklearn.datasets.make_blobs``), train and test alike."""
    from sklearn.datasets import make_blobs as _blobs

    X, _ = _blobs(
        n_samples=n_train + n_test, n_features=dim, centers=centers, cluster_std=std,
        center_box=(-10.0, 10.0), random_state=seed,
    )
    X = _as_f32(X)
    return Dataset(
        "blobs", _as_f32(X[:n_train]), _as_f32(X[n_train:]),
        f"Gaussian blobs: {centers} centres, d={dim}, std {std:g}, box [-10, 10]",
    )


def subsample(ds: Dataset, n_train: int, n_test: int, seed: int = 0) -> Dataset:
    """A random subset of ``n_train`` training and ``n_test`` validation rows of ``ds``."""
    rng = np.random.default_rng(seed)
    tr = rng.choice(ds.train.shape[0], size=min(n_train, ds.train.shape[0]), replace=False)
    te = rng.choice(ds.test.shape[0], size=min(n_test, ds.test.shape[0]), replace=False)
    return Dataset(
        ds.name, _as_f32(ds.train[np.sort(tr)]), _as_f32(ds.test[np.sort(te)]),
        f"{ds.description}; subsample {tr.size} train / {te.size} test",
    )


# -- INFMNIST analogue ----------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$NMBATCH_BENCH_CACHE``, else ``$XDG_CACHE_HOME/nmbatch-bench``, else
    ``~/.cache/nmbatch-bench``, else a directory under the system temp dir."""
    env = os.environ.get("NMBATCH_BENCH_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "nmbatch-bench"
    home = Path.home()
    if home.is_dir() and os.access(home, os.W_OK):
        return home / ".cache" / "nmbatch-bench"
    return Path(tempfile.gettempdir()) / "nmbatch-bench"


def deform_digits(
    images: np.ndarray,
    rng: np.random.Generator,
    *,
    side: int = 28,
    alpha: float = 16.0,
    sigma: float = 4.0,
    max_shift: float = 1.5,
) -> np.ndarray:
    """Elastically deform and translate square grey images.

    Each image gets its own displacement field: uniform noise in ``[-1, 1]`` per pixel and
    axis, smoothed by a Gaussian of width ``sigma`` pixels and scaled by ``alpha`` (Simard,
    Steinkraus & Platt 2003, as used for infinite MNIST by Loosli, Canu & Bottou 2007;
    ``alpha = 16`` is about half Simard's 34 and keeps every digit plainly recognisable),
    plus one uniform translation in ``[-max_shift, max_shift]`` per axis. Pixels are
    resampled with bilinear interpolation (``scipy.ndimage.map_coordinates``, zero outside).

    Parameters
    ----------
    images : (m, side * side) uint8 (or any real dtype)
    rng : numpy Generator, consumed in a fixed order (reproducible)

    Returns
    -------
    (m, side * side) uint8
    """
    from scipy.ndimage import gaussian_filter, map_coordinates

    m = images.shape[0]
    img = images.reshape(m, side, side).astype(np.float32)
    noise = rng.uniform(-1.0, 1.0, size=(2, m, side, side)).astype(np.float32)
    field = gaussian_filter(noise, sigma=(0, 0, sigma, sigma)) * alpha
    shift = rng.uniform(-max_shift, max_shift, size=(2, m, 1, 1)).astype(np.float32)
    ii, yy, xx = np.meshgrid(
        np.arange(m, dtype=np.float32), np.arange(side, dtype=np.float32),
        np.arange(side, dtype=np.float32), indexing="ij",
    )
    coords = np.stack([ii, yy + field[0] + shift[0], xx + field[1] + shift[1]])
    out = map_coordinates(img, coords, order=1, mode="constant", cval=0.0)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8).reshape(m, side * side)


def make_infmnist(
    mnist_path: str | os.PathLike[str],
    *,
    n: int = 400_000,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    chunk: int = 10_000,
    alpha: float = 16.0,
    sigma: float = 4.0,
    max_shift: float = 1.5,
) -> Dataset:
    """``n`` deformed copies of MNIST ``train`` (digit ``i`` from source ``i mod 60000``).

    Chunk ``c`` is generated by ``deform_digits`` with the generator
    ``default_rng([seed, c])`` (and ``alpha``, ``sigma``, ``max_shift``), so the result
    depends only on the source digits and the arguments.
    The ``uint8`` array is cached as ``.npy`` in ``cache_dir`` (default
    :func:`default_cache_dir`) under a name that includes a hash of the source digits;
    the validation set is MNIST ``test``.
    """
    mnist_path = Path(mnist_path)
    with np.load(mnist_path) as f:
        source = np.ascontiguousarray(f["train"])
        test = _as_f32(f["test"])
    if source.ndim != 2 or source.shape[1] != 784:
        raise ValueError(f"MNIST train must be (n, 784), got {source.shape}")
    digest = hashlib.sha1(source.tobytes()).hexdigest()[:12]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    params = f"n{n}-s{seed}-c{chunk}-a{alpha:g}-g{sigma:g}-t{max_shift:g}"
    path = cache / f"infmnist-v{INFMNIST_VERSION}-{digest}-{params}.npy"
    if path.exists():
        train_u8 = np.load(path, mmap_mode="r")
    else:
        cache.mkdir(parents=True, exist_ok=True)
        train_u8 = np.empty((n, 784), dtype=np.uint8)
        src = source.astype(np.uint8, copy=False)
        for c, start in enumerate(range(0, n, chunk)):
            rows = np.arange(start, min(start + chunk, n)) % src.shape[0]
            train_u8[start : start + rows.size] = deform_digits(
                src[rows], np.random.default_rng([seed, c]), alpha=alpha, sigma=sigma,
                max_shift=max_shift,
            )
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".npy.part")
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, train_u8)
        os.replace(tmp, path)
    return Dataset(
        "infmnist", _as_f32(train_u8), test,
        f"INFMNIST analogue: {n} elastic/translated copies of MNIST train "
        f"(seed {seed}), validated on MNIST test {test.shape}",
    )
