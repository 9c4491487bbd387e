"""MNIST for the benchmark (``benchmarks/mnist.py``): IDX decoding, download, cache.

The files are small IDX files the tests build themselves, served by a real HTTP server on
a free loopback port; the checksums given to ``fetch_mnist`` are theirs.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from benchmarks import cli, datasets, mnist, options


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """``array`` in the IDX format: magic, big-endian uint32 sizes, big-endian data."""
    dtype = {0x08: ">u1", 0x0B: ">i2", 0x0D: ">f4"}[type_code]
    header = bytes([0, 0, type_code, array.ndim])
    sizes = np.asarray(array.shape, dtype=">u4").tobytes()
    return header + sizes + np.ascontiguousarray(array, dtype=dtype).tobytes()


def synthetic_mnist(seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays in the MNIST layout of the IDX files: images (n, 28, 28), labels (n,)."""
    rng = np.random.default_rng(seed)
    return {
        "train": rng.integers(0, 256, size=(12, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, size=12, dtype=np.uint8),
        "test": rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, size=5, dtype=np.uint8),
    }


def write_idx_gz(folder: Path, arrays: dict[str, np.ndarray]) -> dict[str, tuple[str, str]]:
    """Write each array as ``<standard file name>`` (gzipped IDX) into ``folder``.

    Returns the ``files`` mapping of ``fetch_mnist``: array name -> (file name, SHA-256).
    """
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for key, array in arrays.items():
        name = mnist.MNIST_FILES[key][0]
        data = gzip.compress(idx_bytes(array))
        (folder / name).write_bytes(data)
        files[key] = (name, hashlib.sha256(data).hexdigest())
    return files


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on a free loopback port serving ``tmp_path / "www"``: (URL, folder)."""
    www = tmp_path / "www"
    www.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(QuietHandler, directory=str(www))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", www
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


# -- IDX --------------------------------------------------------------------------------
def test_read_idx_decodes_images_labels_and_wider_types() -> None:
    images = synthetic_mnist()["train"]
    out = mnist.read_idx(idx_bytes(images))
    assert out.dtype == np.uint8 and out.shape == (12, 28, 28)
    np.testing.assert_array_equal(out, images)
    labels = np.array([7, 0, 9], dtype=np.uint8)
    np.testing.assert_array_equal(mnist.read_idx(idx_bytes(labels)), labels)
    wide = np.array([[-300, 2], [3, 40000 - 65536]], dtype=np.int16)
    out = mnist.read_idx(idx_bytes(wide, 0x0B))
    assert out.dtype == np.int16 and out.dtype.isnative
    np.testing.assert_array_equal(out, wide)
    floats = np.array([1.5, -2.25], dtype=np.float32)
    np.testing.assert_array_equal(mnist.read_idx(idx_bytes(floats, 0x0D)), floats)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x1f\x8b\x08\x00", "not an IDX"),  # a gzip header: still compressed
        (bytes([0, 0, 0x08, 3, 0, 0, 0, 2]), "cut short"),
        (idx_bytes(np.zeros((2, 3), np.uint8))[:-1], "needs 6 bytes"),
        (idx_bytes(np.zeros((2, 3), np.uint8)) + b"\x00", "needs 6 bytes"),
    ],
    ids=["gzip", "short header", "short data", "long data"],
)
def test_read_idx_refuses_what_is_not_idx(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mnist.read_idx(data)


# -- download and cache -----------------------------------------------------------------
def test_download_writes_the_npz_layout_and_keeps_no_downloads(
    tmp_path: Path, served: tuple[str, Path]
) -> None:
    url, www = served
    arrays = synthetic_mnist()
    files = write_idx_gz(www, arrays)
    home = tmp_path / "home"
    lines: list[str] = []
    path = mnist.fetch_mnist(home, base_url=url, files=files, log=lines.append)
    assert path == home / "mnist.npz"
    assert sorted(p.name for p in home.iterdir()) == ["mnist.npz"]
    assert len(lines) == 4 and all(line.startswith(f"downloading {url}") for line in lines)
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["test", "test_labels", "train", "train_labels"]
        for key in ("train", "test"):
            assert npz[key].dtype == np.uint8 and npz[key].shape == (len(arrays[key]), 784)
            np.testing.assert_array_equal(npz[key], arrays[key].reshape(-1, 784))
        for key in ("train_labels", "test_labels"):
            assert npz[key].dtype == np.uint8
            np.testing.assert_array_equal(npz[key], arrays[key])
    ds = datasets.load_npz(path)
    assert ds.name == "mnist" and ds.train.shape == (12, 784) and ds.test.shape == (5, 784)


def test_checksum_mismatch_is_refused_and_nothing_is_kept(
    tmp_path: Path, served: tuple[str, Path]
) -> None:
    url, www = served
    files = write_idx_gz(www, synthetic_mnist())
    name, _ = files["test"]
    files["test"] = (name, hashlib.sha256(b"another file").hexdigest())
    home = tmp_path / "home"
    with pytest.raises(mnist.MnistDownloadError, match=f"{name} has SHA-256 .* expected"):
        mnist.fetch_mnist(home, base_url=url, files=files)
    assert not (home / "mnist.npz").exists()
    assert not (home / name).exists()
    assert not list(home.glob("*.part"))


def test_http_error_names_the_url(tmp_path: Path, served: tuple[str, Path]) -> None:
    url, _ = served  # serves an empty folder: 404
    with pytest.raises(mnist.MnistDownloadError, match="404"):
        mnist.fetch_mnist(tmp_path / "home", base_url=url)


def test_a_cached_file_is_used_without_the_network(tmp_path: Path, closed_port_url: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    np.savez(home / "mnist.npz", train=np.ones((3, 784), np.uint8), test=np.ones((2, 784)))
    assert mnist.fetch_mnist(home, base_url=closed_port_url) == home / "mnist.npz"


def test_offline_without_a_cache_is_a_download_error(tmp_path: Path, closed_port_url: str) -> None:
    with pytest.raises(mnist.MnistDownloadError, match=f"cannot download {closed_port_url}"):
        mnist.fetch_mnist(tmp_path / "home", base_url=closed_port_url)
    assert not (tmp_path / "home" / "mnist.npz").exists()


def test_data_home_is_the_environment_variable_or_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NMBATCH_DATA_HOME", str(tmp_path / "data"))
    assert mnist.data_home() == tmp_path / "data"
    monkeypatch.delenv("NMBATCH_DATA_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mnist.data_home() == tmp_path / "xdg" / "nmbatch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert mnist.data_home() == tmp_path / "user" / ".cache" / "nmbatch"


# -- the benchmark command --------------------------------------------------------------
def test_bench_dataset_mnist_reads_the_cached_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closed_port_url: str
) -> None:
    monkeypatch.setenv("NMBATCH_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("NMBATCH_MNIST_URL", closed_port_url)
    train = np.arange(20 * 784, dtype=np.uint32).reshape(20, 784) % 256
    np.savez(tmp_path / "mnist.npz", train=train.astype(np.uint8), test=np.zeros((4, 784)))
    ds = options.load_dataset(options.build_parser().parse_args(["--dataset", "mnist"]))
    assert ds.name == "mnist" and ds.train.dtype == np.float32
    np.testing.assert_array_equal(ds.train, train.astype(np.float32))
    assert ds.test.shape == (4, 784)


def test_bench_offline_without_a_cache_exits_2_and_asks_for_data(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    closed_port_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("NMBATCH_DATA_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("NMBATCH_MNIST_URL", closed_port_url)
    code = cli.main(["--dataset", "mnist", "--no-keep-memory", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot download {closed_port_url}" in err
    assert "pass --data FILE.npz" in err
    assert not (tmp_path / "out").exists()
