"""The dashboard in headless Chromium against a real ``python -m nmbatch`` and redis-server.

Three blobs are sent in three parts while the page is open: before the first centroids
the page says why there are none; then every panel renders, the map shows one marker per
centroid, the numbers shown are those of ``/stats`` and ``/centroids``, the map's
coordinates are numpy's PCA of the centroids, a reload shows the energy history, and the
console has no error at any time (the page polls only ``/dashboard/data``, which answers
``200`` in every state). With the API key needed for reads, the page asks for it, keeps it
in the tab's session and sends it only as a header (the two ``401`` answers, to no key
and to a wrong one, are the only console errors); with Redis stopped it says so and keeps
the last centroids, still without a console error.

The screenshot goes to ``test-artifacts/dashboard.png`` (gitignored) and the test's tmp
folder, and to ``$DASHBOARD_PNG`` when set (the README's ``docs/dashboard.png``:
``DASHBOARD_PNG=docs/dashboard.png .venv/bin/pytest tests/browser -q``).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from nmbatch.service.embedded_redis import EmbeddedRedis, free_port
from tests.browser.conftest import WatchedPage
from tests.testkit import blobs, npy_bytes, wait_until

REPO = Path(__file__).resolve().parents[2]
DATA = "/dashboard/data"
K, DIM, N = 3, 8, 3000
PANELS = ("ingestion", "batch", "energy", "sweep", "clusters", "map", "health")


def post_samples(base: str, X: np.ndarray, key: str | None = None) -> None:
    headers = {"content-type": "application/x-npy"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    response = httpx.post(f"{base}/samples", content=npy_bytes(X), headers=headers, timeout=20)
    assert response.status_code == 202, response.text


def converged(base: str, n: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        doc = httpx.get(f"{base}/centroids", headers=headers, timeout=10)
        body = doc.json() if doc.status_code == 200 else {}
        last[:] = [doc.status_code, {k: v for k, v in body.items() if k != "centroids"}]
        return body if body.get("converged") and body.get("n_samples") == n else None

    last: list[Any] = []
    try:
        # Generous: on a fresh clone the engine process compiles its kernels first.
        return wait_until(done, 300, "convergence")
    except BaseException:
        print("last /centroids answer:", last)
        raise


def value(page: WatchedPage, element_id: str) -> str | None:
    return page.page.get_attribute(f"#{element_id}", "data-value")


def api_requests(page: WatchedPage) -> list[tuple[str, dict[str, str]]]:
    """The page's HTTP requests other than for itself and its files: ``(path, headers)``."""
    paths = [(urlsplit(url).path, headers) for url, headers in page.requests
             if url.startswith("http")]  # fmt: skip
    return [(path, h) for path, h in paths if not path.startswith("/dashboard/static/")
            and path != "/dashboard"]  # fmt: skip


def save_screenshot(page: WatchedPage, tmp_path: Path) -> Path:
    shot = tmp_path / "dashboard.png"
    page.page.screenshot(path=str(shot), full_page=True)
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copyfile(shot, artifacts / "dashboard.png")
    if target := os.environ.get("DASHBOARD_PNG"):
        shutil.copyfile(shot, REPO / target)
    return shot


def test_the_dashboard_shows_the_model_as_the_api_does(
    start_service: Any, open_page: Any, tmp_path: Path
) -> None:
    service = start_service("dash", k=K, batch_size=64, data_dir=tmp_path / "data",
                            worker_threads=1)  # fmt: skip
    service.ready(300)
    page = open_page()
    page.page.goto(f"{service.base}/dashboard")
    # Before the first centroids: the panels say why they are empty.
    page.page.wait_for_selector("#status[data-state='waiting']", timeout=20_000)
    assert "No centroids yet" in page.page.inner_text("#panel-map")
    assert "No sweep yet" in page.page.inner_text("#panel-sweep")
    assert "k = 3 are needed" in page.page.inner_text("#panel-clusters")
    assert page.errors == [], page.errors
    X = blobs(N, DIM, K, seed=3, separation=12.0)
    for part in np.array_split(X, 3):  # three parts: the page sees several versions
        post_samples(service.base, part)
        time.sleep(2.5)
    centroids = converged(service.base, N)
    page.page.wait_for_selector("#status[data-state='ok']", timeout=20_000)
    assert page.errors == [], page.errors
    for vector in X[:20]:  # some /assign answers for the latency figures
        httpx.get(f"{service.base}/assign", params={"vector": ",".join(map(str, vector))})
    # A sweep of k: the page draws its held-out energy by k, the recommended k marked.
    sweep = httpx.post(f"{service.base}/sweep", json={"ks": [2, 3, 4, 6, 8]}, timeout=120).json()
    assert sweep["recommended_k"] == K, sweep
    page.page.wait_for_function(
        "k => document.querySelector('#fig-sweep-k').dataset.value === String(k)",
        arg=K,
        timeout=20_000,
    )
    page.page.wait_for_function(
        "v => document.querySelector('#fig-version').dataset.value === String(v)",
        arg=centroids["version"],
        timeout=20_000,
    )
    page.page.wait_for_function(
        "() => Number(document.querySelector('#fig-assign-count').dataset.value) >= 20",
        timeout=20_000,
    )
    time.sleep(2.5)  # one more poll: the rate chart has points on both sides

    stats = httpx.get(f"{service.base}/stats", timeout=10).json()
    assert stats["version"] == centroids["version"] and stats["converged"]
    # Every panel renders, with content and no placeholder.
    for name in PANELS:
        panel = page.page.locator(f"[data-panel='{name}']")
        assert panel.is_visible(), name
        assert panel.locator(".placeholder").count() == 0, name
    for chart in ("ingestion", "batch", "energy"):
        assert page.page.locator(f"#chart-{chart} canvas").count() >= 1, chart
    assert page.page.evaluate("NmbDashboard.charts.sweep.data[0]") == [2, 3, 4, 6, 8]
    drawn = page.page.evaluate("NmbDashboard.charts.sweep.data[1]")
    assert drawn == pytest.approx([p["heldout_energy"] for p in sweep["points"]], rel=1e-12)
    marks = page.page.evaluate("NmbDashboard.charts.sweep.data[2]")
    assert [m is not None for m in marks] == [k == K for k in (2, 3, 4, 6, 8)]
    assert value(page, "fig-sweep-rows") == str(sweep["n_train"])
    assert page.page.evaluate("NmbDashboard.state.energy.size") > 1
    assert page.page.evaluate("NmbDashboard.state.ingest.t.length") >= 2
    assert page.page.get_attribute("#status", "data-state") == "ok"
    assert not page.page.is_visible("#notice")

    # The map: one marker per centroid, sized by the counts of /centroids.
    markers = page.page.locator("#map [data-centroid]")
    assert markers.count() == K
    counts = {int(m.get_attribute("data-centroid")): int(m.get_attribute("data-count"))
              for m in markers.all()}  # fmt: skip
    assert counts == dict(enumerate(centroids["counts"]))
    bars = page.page.locator("#clusters [data-cluster]")
    assert sorted(int(b.get_attribute("data-count")) for b in bars.all()) == sorted(
        centroids["counts"]
    )
    # Its coordinates are the PCA of the centroids (numpy's SVD), up to each axis' sign.
    C = np.array(centroids["centroids"], dtype=np.float64)
    U, S, _ = np.linalg.svd(C - C.mean(axis=0), full_matrices=False)
    expected = U[:, :2] * S[:2]
    by_index = sorted(markers.all(), key=lambda m: int(m.get_attribute("data-centroid")))
    shown = np.array([[float(m.get_attribute(f"data-pc{a}")) for a in (1, 2)] for m in by_index])
    for axis in range(2):
        sign = np.sign(expected[:, axis] @ shown[:, axis]) or 1.0
        np.testing.assert_allclose(shown[:, axis], sign * expected[:, axis], atol=1e-6 * S[0])

    # The figures are those of /stats and /centroids.
    assert value(page, "fig-n-samples") == str(stats["n_samples"]) == str(N)
    assert value(page, "fig-n-ingested") == str(stats["n_ingested"])
    assert value(page, "fig-b") == str(stats["b"])
    assert value(page, "fig-iteration") == str(stats["iteration"])
    assert value(page, "fig-doublings") == str(len(stats["doublings"]))
    assert value(page, "fig-capacity") == str(stats["max_samples"])
    assert float(value(page, "fig-energy")) == pytest.approx(stats["energy"], rel=1e-12)
    assert float(value(page, "fig-skipped")) == pytest.approx(stats["skipped_share"], rel=1e-12)
    assert value(page, "fig-k") == str(K)
    assert value(page, "fig-largest") == str(max(centroids["counts"]))
    assert page.page.inner_text("#fig-n-samples") == f"{N:,}"
    health = httpx.get(f"{service.base}/dashboard/data", timeout=10).json()
    assert int(value(page, "fig-assign-count")) == health["assign_latency"]["count"] >= 20
    assert float(value(page, "fig-p50")) == pytest.approx(health["assign_latency"]["p50"])
    assert value(page, "fig-server-errors") == str(health["server_errors"])
    assert value(page, "fig-assign-errors") == str(health["assign_errors"]) == "0"
    assert page.page.get_attribute("#fig-assign-errors", "data-flag") == "good"
    # The page polled only /dashboard/data, and sent the version it held once it had one.
    polled = api_requests(page)
    assert {path for path, _ in polled} == {DATA}, polled
    assert any("/dashboard/data?since=" in url for url, _ in page.requests)

    shot = save_screenshot(page, tmp_path)
    assert shot.stat().st_size > 20_000
    assert page.errors == [], page.errors

    # A reload shows the energy history the server kept, not only what it sees from now.
    page.page.reload()
    page.page.wait_for_selector("#map [data-centroid]", timeout=20_000)
    versions = page.page.evaluate("NmbDashboard.charts.energy.data[0]")
    assert len(versions) > 1 and versions[-1] == stats["version"], versions
    energy = page.page.evaluate("NmbDashboard.charts.energy.data[1]")
    assert energy[-1] == pytest.approx(stats["energy"], rel=1e-12)
    assert page.errors == [], page.errors


def test_api_key_flow_and_a_redis_outage(
    start_service: Any, open_page: Any, tmp_path: Path
) -> None:
    key = "dashboard-test-key"
    redis_server = EmbeddedRedis(tmp_path / "redis", port=free_port())
    redis_server.start()
    port = redis_server.port
    try:
        service = start_service(
            "keyed", k=K, batch_size=64, redis_url=redis_server.url, api_key=key,
            api_key_reads="true", worker_threads=1,
        )  # fmt: skip
        service.ready(300)
        auth = {"authorization": f"Bearer {key}"}
        post_samples(service.base, blobs(600, DIM, K, seed=5), key=key)
        centroids = converged(service.base, 600, auth)

        page = open_page()
        page.page.goto(f"{service.base}/dashboard")
        page.page.wait_for_selector("#key-overlay:not([hidden])", timeout=20_000)
        assert page.page.get_attribute("#status", "data-state") == "key"
        page.page.fill("#api-key", "wrong-key")
        page.page.click("#key-form button[type=submit]")
        page.page.wait_for_selector("#key-error:not([hidden])", timeout=20_000)
        assert "refused" in page.page.inner_text("#key-error")
        refused = len(api_requests(page))
        page.page.fill("#api-key", key)
        page.page.click("#key-form button[type=submit]")
        page.page.wait_for_selector("#key-overlay", state="hidden", timeout=20_000)
        page.page.wait_for_selector("#map [data-centroid]", timeout=20_000)
        assert page.page.locator("#map [data-centroid]").count() == K
        assert value(page, "fig-version") == str(centroids["version"])
        assert page.page.evaluate("sessionStorage.getItem('nmbatch.apiKey')") == key
        # The key travels only in the header, never in an address.
        assert all(key not in url for url, _ in page.requests)
        sent = api_requests(page)[refused:]
        assert sent and all(h.get("authorization") == f"Bearer {key}" for _, h in sent), sent
        assert {path for path, _ in api_requests(page)} == {DATA}
        # A reload keeps it for the tab's session: no form again.
        page.page.reload()
        page.page.wait_for_selector("#map [data-centroid]", timeout=20_000)
        assert page.page.is_hidden("#key-overlay")

        # Redis away: the page says so and keeps the last centroids, for several polls.
        redis_server.stop()
        page.page.wait_for_selector("#status[data-state='down']", timeout=30_000)
        assert "Redis is unreachable" in page.page.inner_text("#notice")
        assert page.page.locator("#map [data-centroid]").count() == K
        assert page.page.get_attribute("#fig-redis", "data-flag") == "bad"
        polls = len(api_requests(page))
        page.page.wait_for_timeout(5_000)
        assert len(api_requests(page)) >= polls + 2
        assert page.page.get_attribute("#status", "data-state") == "down"
        redis_server = EmbeddedRedis(tmp_path / "redis", port=port)
        redis_server.start()
        page.page.wait_for_selector("#status[data-state='ok']", timeout=60_000)
        assert page.page.is_hidden("#notice")
        # The only console errors: the 401 answers to no key and to the wrong key.
        assert len(page.errors) == 2, page.errors
        assert all(" status of 401 " in e and DATA in e for e in page.errors), page.errors
    finally:  # the start_service fixture stops the service
        redis_server.stop()
