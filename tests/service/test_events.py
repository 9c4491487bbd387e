"""Events (issue 36, item 6): ``GET /events`` as Server-Sent Events from a real server
(uvicorn on a socket) over a real Redis; the drift figure and its alarm; the client's
``events()`` (sync and async) and ``nmbatch watch`` over them, polling as the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from nmbatch.service.main import create_app
from nmbatch.service.storage import ModelKeys
from nmbatch.service.storage.events import (
    EVENT_MAX_BYTES,
    PENDING_EVENTS,
    EventWriter,
    encode,
)
from nmbatch_client import (
    AsyncClient,
    Client,
    ConnectionFailedError,
    NotFoundError,
    UnavailableError,
)
from nmbatch_client.cli import _watch
from tests.hardening.hardening_helpers import live_server
from tests.testkit import SettingsFactory, TestClient, assert_problem, blobs, metric, wait_until

READ = "read-key-0123456789abcdef"
ADMIN = "admin-key-0123456789abcdef"


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events and comments of an open ``text/event-stream`` response, as dicts."""
    fields: dict[str, Any] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
        elif not line:
            if fields:
                yield fields
            fields = {}
        else:
            name, _, value = line.partition(": ")
            fields[name] = json.loads(value) if name == "data" else value


def take(response: httpx.Response, n: int, kinds: set[str] | None = None) -> list[dict]:
    """The next ``n`` events (of ``kinds`` if given), comments skipped."""
    out: list[dict] = []
    for item in sse(response):
        if "id" in item and (kinds is None or item["event"] in kinds):
            out.append(item)
            if len(out) == n:
                break
    return out


def post(base: str, X: np.ndarray, path: str = "/samples") -> None:
    body = io.BytesIO()
    np.save(body, X)
    answer = httpx.post(base + path, content=body.getvalue(),
                        headers={"content-type": "application/x-npy"}, timeout=30)  # fmt: skip
    assert answer.status_code == 202, answer.text


def redis_events(client: redis.Redis, model: str) -> list[tuple[str, str]]:
    return [(i.decode(), f[b"type"].decode()) for i, f in client.xrange(ModelKeys(model).events)]


def test_events_arrive_in_order_and_resume_after_the_last_event_id(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(dim=2, k=3, batch_size=16, rho=100.0, events_heartbeat_seconds=0.2)
    X = blobs(2000, 2, 3, seed=5, separation=10.0)
    with live_server(settings) as server:
        base = server.base_url
        with httpx.stream("GET", base + "/events", timeout=30) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            post(base, X)
            got: list[dict] = []
            for item in sse(stream):  # until a doubling and a version came
                if "id" in item:
                    got.append(item)
                    if {"doubling", "version"} <= {e["event"] for e in got}:
                        break
        sent = redis_events(redis_client, model_name)
        assert sent, "the worker wrote no event"
        ids = [i for i, _ in sent]
        assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
        assert [e["id"] for e in got] == ids[: len(got)]  # live, in order
        kinds = {k for _, k in sent}
        assert {"version", "doubling"} <= kinds
        # Resume after the first event: every later one, in order, as Redis holds them.
        with httpx.stream("GET", base + "/events", headers={"Last-Event-ID": ids[0]},
                          timeout=30) as stream:  # fmt: skip
            replayed = take(stream, len(ids) - 1)
        assert [(e["id"], e["event"]) for e in replayed] == sent[1:]
        # A version event says what the kept version holds.
        version = next(e for e in got if e["event"] == "version")["data"]
        assert {"version", "energy", "n_samples", "k", "since", "n_relocated"} <= set(version)
        # Heartbeats while nothing happens; a fresh reader starts after the newest event.
        with httpx.stream("GET", base + "/events", timeout=30) as stream:
            reading = sse(stream)
            first = next(item for item in reading if item.get("comment") == "heartbeat")
        assert first == {"comment": "heartbeat"}
        bad = httpx.get(base + "/events", headers={"Last-Event-ID": "yesterday"}, timeout=10)
        assert_problem(bad, 422, "invalid-last-event-id")
        # The named models' path serves the same stream of the default model's name
        assert httpx.get(base + "/models/no-such/events", timeout=10).status_code == 404


def test_events_need_the_read_scope_and_the_streams_are_bounded(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(
        api_keys=f"{READ} read; {ADMIN} admin", api_key_reads=True, events_max_connections=1,
        events_heartbeat_seconds=0.2,
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:  # refusals come before any stream
        assert_problem(client.get("/events"), 401)
        assert_problem(client.get("/events", headers={"Authorization": "Bearer nope"}), 401)
    with live_server(settings) as server:
        url, auth = server.base_url + "/events", {"Authorization": f"Bearer {READ}"}
        with httpx.stream("GET", url, headers=auth, timeout=30) as stream:
            assert stream.status_code == 200
            reading = sse(stream)  # held: a closed iterator closes the response
            next(reading)  # the opening comment: the stream runs
            busy = httpx.get(url, headers=auth, timeout=10)
            problem = assert_problem(busy, 503, "too-many-event-streams")
            assert problem["max_streams"] == 1 and busy.headers["retry-after"] == "1"
            # other requests are not held by the stream (admission does not count it)
            assert httpx.get(server.base_url + "/stats", headers=auth, timeout=10).is_success

        def free() -> bool:
            with httpx.stream("GET", url, headers=auth, timeout=30) as again:
                return again.status_code == 200

        wait_until(free, 10, "the stream's slot given back")


def test_the_drift_figure_and_its_alarm_on_shifted_data(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(dim=2, k=3, batch_size=64, drift_window=300, drift_alarm=4.0)
    X = blobs(3000, 2, 3, seed=6, separation=10.0)
    with TestClient(create_app(settings)) as client:
        post_tc(client, X[:2000])  # no model yet: these rows are not measured

        def measured() -> float | None:
            stats = client.get("/stats").json()
            return stats["drift"] if stats["converged"] and stats["drift"] is not None else None

        wait_until(lambda: client.get("/stats").json()["converged"], 60, "a first model")
        assert client.get("/stats").json()["drift"] is None
        post_tc(client, X[2000:])  # measured on arrival under the served centroids

        calm = wait_until(measured, 60, "a drift figure on the fitted data")
        assert 0.3 < calm < 2.0  # the newest rows are like the rest
        assert client.get("/stats").json()["drift_alarm"] == 4.0
        assert not [k for _, k in redis_events(redis_client, model_name) if k == "drift"]
        post_tc(client, blobs(300, 2, 3, seed=7, separation=10.0) + np.float32(80.0))

        def alarmed() -> list[dict]:
            return [json.loads(f[b"data"]) for _, f in
                    redis_client.xrange(ModelKeys(model_name).events)
                    if f[b"type"] == b"drift"]  # fmt: skip

        (alarm,) = wait_until(alarmed, 30, "a drift event")
        assert alarm["drift"] >= 4.0 and alarm["alarm"] == 4.0 and alarm["rows"] == 300
        assert client.get("/stats").json()["drift"] >= 4.0  # the shifted rows, on arrival
        text = client.get("/metrics").text
        assert metric(text, "nmbatch_drift", model=model_name) > 0


def post_tc(client: TestClient, X: np.ndarray) -> None:
    body = io.BytesIO()
    np.save(body, X)
    answer = client.post("/samples", content=body.getvalue(),
                         headers={"content-type": "application/x-npy"})  # fmt: skip
    assert answer.status_code == 202, answer.text


def test_an_event_is_bounded_in_bytes_and_a_writer_keeps_what_it_could_not_write(
    redis_client: redis.Redis, model_name: str
) -> None:
    text = encode({"version": 3, "relocated": list(range(5000)), "n_relocated": 5000})
    assert len(text) <= EVENT_MAX_BYTES and json.loads(text)["n_relocated"] == 5000
    writer = EventWriter(redis_client, model_name, keep=5)
    for i in range(250):
        writer.emit("version", {"version": i})
    assert writer.flush() == 250 and not writer.pending
    kept = redis_events(redis_client, model_name)
    assert 5 <= len(kept) <= 5 + 100  # MAXLEN ~ trims whole nodes (100 entries)
    assert json.loads(redis_client.xrevrange(ModelKeys(model_name).events, count=1)[0][1][b"data"])
    for i in range(PENDING_EVENTS + 10):  # a full queue drops its oldest
        writer.emit("version", {"version": i})
    assert len(writer.pending) == PENDING_EVENTS and writer.dropped == 10
    writer.pending.clear()
    away = EventWriter(redis.Redis(port=1, socket_connect_timeout=0.2), model_name, keep=5)
    away.emit("drift", {"drift": 9.0})
    with pytest.raises(redis.ConnectionError):
        away.flush()
    assert len(away.pending) == 1  # kept for the next flush


# -- the client -------------------------------------------------------------------------------
def test_the_clients_follow_the_events_and_resume(make_settings: SettingsFactory) -> None:
    settings = make_settings(dim=2, k=3, batch_size=16)
    X = blobs(1500, 2, 3, seed=8, separation=10.0)
    with live_server(settings) as server, Client(server.base_url) as client:
        seen: list[Any] = []

        def follow() -> None:
            for event in client.events():
                seen.append(event)
                if len(seen) >= 3 and "version" in {e.type for e in seen}:
                    return

        reader = threading.Thread(target=follow)
        reader.start()
        wait_until(lambda: server_streams(server) == 1, 10, "the client's stream open")
        post(server.base_url, X)
        reader.join(30)
        assert not reader.is_alive()
        assert next(e for e in seen if e.type == "version").data["version"] >= 1
        # Resumed after the first: the rest again, in order, with the same ids.
        again = []
        for event in client.events(last_event_id=seen[0].id):
            again.append(event)
            if len(again) == len(seen) - 1:
                break
        assert [(e.id, e.type) for e in again] == [(e.id, e.type) for e in seen[1:]]

        async def first_async() -> list[Any]:
            async with AsyncClient(server.base_url) as aclient:
                out = []
                async for event in aclient.events(last_event_id=seen[0].id):
                    out.append(event)
                    if len(out) == 2:
                        return out
            return out

        assert [e.id for e in asyncio.run(first_async())] == [e.id for e in seen[1:3]]


def test_the_clients_wait_after_a_later_answer_and_raise_refusals(
    make_settings: SettingsFactory,
) -> None:
    # Client.events and AsyncClient.events drive one EventStream: a "later" answer (503,
    # the one stream slot taken) is raised without reconnect and waited out with it; a
    # refusal (404, an unknown model) raises; no answer raises without reconnect.
    settings = make_settings(
        dim=2, k=3, batch_size=16, events_max_connections=1, events_heartbeat_seconds=0.2
    )
    X = blobs(600, 2, 3, seed=9, separation=10.0)
    with live_server(settings) as server, Client(server.base_url) as client:
        slot = contextlib.ExitStack()
        held = slot.enter_context(httpx.stream("GET", server.base_url + "/events", timeout=30))
        assert held.status_code == 200
        with pytest.raises(UnavailableError):
            next(client.events(reconnect=False))

        async def first_async() -> None:
            async with AsyncClient(server.base_url) as aclient:
                async for _ in aclient.events(reconnect=False):
                    return

        with pytest.raises(UnavailableError):
            asyncio.run(first_async())
        with Client(server.base_url, model="nope") as unknown, pytest.raises(NotFoundError):
            next(unknown.events())
        seen: list[Any] = []

        def follow() -> None:  # refused "later" first (Retry-After: 1), then let in
            for event in client.events():
                seen.append(event)
                if event.type == "version":
                    return

        reader = threading.Thread(target=follow)
        reader.start()
        time.sleep(0.3)
        slot.close()  # the slot given back: the reader gets in at its next attempt
        deadline = time.monotonic() + 30
        while reader.is_alive() and time.monotonic() < deadline:
            post(server.base_url, X)  # new versions until the reader saw one
            reader.join(0.5)
        assert not reader.is_alive() and seen[-1].type == "version"
    with Client("http://127.0.0.1:1") as closed, pytest.raises(ConnectionFailedError):
        next(closed.events(reconnect=False))


def server_streams(server: Any) -> int:
    """Streams open on ``server`` (its app's slots), for the tests' waits."""
    return int(server.app.state.event_streams.open)


def test_watch_follows_the_events_and_polls_without_them(make_settings: SettingsFactory) -> None:
    settings = make_settings(dim=2, k=3, batch_size=16)
    with live_server(settings) as server, Client(server.base_url) as client:
        args = type("Args", (), {"once": False, "count": 3, "interval": 30.0, "poll": False})
        out = io.StringIO()
        watcher = threading.Thread(target=_watch, args=(client, args, out))
        watcher.start()
        wait_until(lambda: server_streams(server) == 1, 10, "watch's stream open")
        started = time.monotonic()
        post(server.base_url, blobs(1500, 2, 3, seed=9, separation=10.0))
        # One line per batch of events: the header, the first line, a line on the
        # post's events; a second post's events make the third (the first post's may
        # all come in one batch).
        wait_until(lambda: len(out.getvalue().splitlines()) >= 3, 20, "a line on events")
        post(server.base_url, blobs(1500, 2, 3, seed=10, separation=10.0))
        watcher.join(30)
        assert not watcher.is_alive()
        assert time.monotonic() - started < 25  # lines on events, not after --interval
        _header, *lines = out.getvalue().splitlines()
        assert len(lines) == 3
        assert any(word in lines[1] + lines[2] for word in ("version", "doubling"))

    # A service without /events (404 there, /stats served): polling, one line per interval.
    def old_service(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/events":
            return httpx.Response(404, json={"type": "about:blank", "title": "Not Found",
                                             "status": 404, "detail": "no route"})  # fmt: skip
        return httpx.Response(200, json={
            "version": 1, "N": 10, "n_ingested": 10, "b": 10, "iteration": 1, "energy": 1.0,
            "phase": "converged", "skipped_share": None,
        })  # fmt: skip

    with Client("http://old", transport=httpx.MockTransport(old_service)) as client:
        args = type("Args", (), {"once": False, "count": 3, "interval": 0.05, "poll": False})
        out = io.StringIO()
        assert _watch(client, args, out) == 0
        _header, *lines = out.getvalue().splitlines()
        assert len(lines) == 3 and all(line.split()[1] == "1" for line in lines)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_the_engines_drift_figure_is_the_plain_formula(metric: str) -> None:
    """Each row's energy: the squared distance to the nearest centroid (cosine: ``1 -
    cos`` of unit rows); the figure: their mean over the reference energy."""
    from nmbatch.engine.assign import drift_ratio, row_energies
    from nmbatch.engine.metric import metric_rows

    rng = np.random.default_rng(3)
    X = metric_rows(rng.standard_normal((500, 6)).astype(np.float32), metric)
    C = metric_rows(rng.standard_normal((7, 6)).astype(np.float32), metric)
    d2 = ((X.astype(np.float64)[:, None, :] - C.astype(np.float64)[None]) ** 2).sum(-1)
    expected = d2.min(axis=1) / (2.0 if metric == "cosine" else 1.0)
    got = row_energies(X, C, metric)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert drift_ratio(got, 0.5) == pytest.approx(expected.mean() / 0.5, rel=1e-5)
    assert drift_ratio(got[:0], 0.5) is None and drift_ratio(got, 0.0) is None
    assert drift_ratio(got, None) is None and drift_ratio(got, float("nan")) is None
