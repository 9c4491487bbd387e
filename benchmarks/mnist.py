"""MNIST for the benchmark: the standard IDX files, downloaded once, checked, cached.

``python -m benchmarks --dataset mnist`` (and ``--dataset infmnist``, which
deforms MNIST ``train``) reads MNIST from ``--data FILE.npz`` when given, else from
``mnist.npz`` in the data folder (:func:`data_home`). When that file is missing,
:func:`fetch_mnist` downloads the four gzipped IDX files of LeCun, Cortes & Burges from
:data:`MNIST_URL` (the mirror TensorFlow's and other loaders use), checks each against
its published SHA-256 (:data:`MNIST_FILES`), converts them to the npz layout below,
writes ``mnist.npz`` and deletes the downloads.

Layout of ``mnist.npz`` (what :func:`benchmarks.datasets.load_npz` reads):

- ``train``: (60000, 784) uint8, each 28x28 image flattened row by row, 0 = background;
- ``train_labels``: (60000,) uint8, the digit 0-9;
- ``test``: (10000, 784) uint8; ``test_labels``: (10000,) uint8.

Offline and without a cached copy, :class:`MnistDownloadError` says to pass ``--data``.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

__all__ = [
    "MNIST_FILES",
    "MNIST_NPZ",
    "MNIST_URL",
    "MnistDownloadError",
    "data_home",
    "fetch_mnist",
    "read_idx",
]

#: Base URL of the gzipped IDX files. ``$NMBATCH_MNIST_URL`` replaces it (a mirror).
MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
#: Array name in ``mnist.npz`` -> (IDX file under :data:`MNIST_URL`, its SHA-256).
MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": (
        "train-images-idx3-ubyte.gz",
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    ),
    "train_labels": (
        "train-labels-idx1-ubyte.gz",
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    ),
    "test": (
        "t10k-images-idx3-ubyte.gz",
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    ),
    "test_labels": (
        "t10k-labels-idx1-ubyte.gz",
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    ),
}
MNIST_NPZ = "mnist.npz"

# IDX element types: the third byte of the magic number.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_CHUNK = 1 << 20


class MnistDownloadError(Exception):
    """MNIST is not cached and could not be downloaded (offline, HTTP error, a checksum
    that differs); the message names the URL and what failed."""


def data_home() -> Path:
    """Folder of downloaded data: ``$NMBATCH_DATA_HOME``, else ``$XDG_CACHE_HOME/nmbatch``,
    else ``~/.cache/nmbatch``."""
    env = os.environ.get("NMBATCH_DATA_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "nmbatch"


def read_idx(data: bytes) -> np.ndarray:
    """The array stored in the (uncompressed) IDX bytes ``data``, in native byte order.

    IDX: two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), a byte ``ndim``, ``ndim`` big-endian uint32 sizes, then
    the elements in C order, big-endian. Raises ``ValueError`` for anything else.
    """
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise ValueError(f"not an IDX file (magic bytes {data[:4].hex()})")
    ndim = data[3]
    start = 4 + 4 * ndim
    if len(data) < start:
        raise ValueError(f"IDX header of {ndim} dimensions is cut short")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[data[2]])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - start != expected:
        raise ValueError(
            f"IDX of shape {shape} and type {dtype} needs {expected} bytes of data, "
            f"found {len(data) - start}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=start).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _download(url: str, dest: Path, sha256: str, timeout: float) -> None:
    """Fetch ``url`` into ``dest`` if its SHA-256 is ``sha256``; otherwise keep nothing."""
    fd, part = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            while block := resp.read(_CHUNK):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != sha256:
            raise MnistDownloadError(
                f"{url} has SHA-256 {digest.hexdigest()}, expected {sha256}; the file was not kept"
            )
        os.replace(part, dest)
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        plain = isinstance(exc, urllib.error.URLError) and not isinstance(
            exc, urllib.error.HTTPError
        )
        reason = exc.reason if plain else exc
        raise MnistDownloadError(f"cannot download {url}: {reason}") from None
    finally:
        Path(part).unlink(missing_ok=True)


def fetch_mnist(
    home: str | os.PathLike[str] | None = None,
    *,
    base_url: str | None = None,
    files: Mapping[str, tuple[str, str]] = MNIST_FILES,
    timeout: float = 60.0,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Path of ``mnist.npz`` in ``home`` (default :func:`data_home`), downloaded if missing.

    A file already there is used as it is (no network). Otherwise every file of ``files``
    (array name -> (file name, SHA-256)) is fetched from ``base_url`` (default
    ``$NMBATCH_MNIST_URL``, else :data:`MNIST_URL`), refused unless its SHA-256 matches,
    and decoded with :func:`read_idx`; images ``(n, 28, 28)`` become rows ``(n, 784)``.
    The npz appears whole or not at all (written to a temporary name, then renamed).
    ``log`` receives one line per download. Raises :class:`MnistDownloadError` when a
    download fails or a checksum differs, ``ValueError`` for a file that is not IDX.
    """
    home = Path(home) if home is not None else data_home()
    target = home / MNIST_NPZ
    if target.is_file():
        return target
    base = base_url or os.environ.get("NMBATCH_MNIST_URL") or MNIST_URL
    base = base if base.endswith("/") else base + "/"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MnistDownloadError(f"cannot create the data folder {home}: {exc}") from None
    arrays: dict[str, np.ndarray] = {}
    downloads = []
    try:
        for key, (name, sha256) in files.items():
            gz = home / name
            if not (gz.is_file() and _sha256(gz) == sha256):
                if log is not None:
                    log(f"downloading {base}{name} into {home}")
                _download(base + name, gz, sha256, timeout)
            downloads.append(gz)
            array = read_idx(gzip.decompress(gz.read_bytes()))
            arrays[key] = array.reshape(array.shape[0], -1) if array.ndim > 2 else array
        fd, tmp = tempfile.mkstemp(dir=home, prefix=MNIST_NPZ + ".", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez_compressed(handle, **arrays)
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    finally:
        if target.is_file():
            for gz in downloads:
                gz.unlink(missing_ok=True)
    return target
