"""The ``GET /assign`` fast path (``service.fastpath``) answers exactly as the FastAPI route.

A query string with one more parameter (which the route ignores) is not a plain request
and goes to the route: so the same vector can be asked of both, and the answers must
be the same bytes. Everything that is not the plain case must reach the route: bad
vectors (same problem), an API key for reads, no model yet. The request metrics label
the fast answers ``/assign`` like the route's.
"""

from __future__ import annotations

from urllib.parse import quote

import numpy as np
import pytest
from service_helpers import wait_converged

from nmbatch.service.config import Settings
from nmbatch.service.fastpath import AssignFastPath
from nmbatch.service.main import create_app
from tests.testkit import SettingsFactory, TestClient

KEY = "k" * 32
POINTS = np.array(
    [[0, 0, 1], [0, 1, 0], [10, 0, 0], [10, 1, 1], [0, 20, 0], [1, 20, 1], [5, 5, 5]],
    dtype=np.float32,
)


def fast_and_route(client: TestClient, text: str) -> tuple:
    fast = client.get(f"/assign?vector={quote(text)}")
    route = client.get(f"/assign?vector={quote(text)}&via=route")
    return fast, route


@pytest.fixture
def converged(client: TestClient) -> dict:
    client.post("/samples", json={"vectors": POINTS.tolist()})
    return wait_converged(client, len(POINTS))


def test_same_answers_as_the_route(
    client: TestClient, converged: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    answered = []  # bodies the fast path produced itself
    answer = AssignFastPath.answer

    def spy(scope: dict) -> bytes | None:
        body = answer(scope)
        answered.append(body is not None)
        return body

    monkeypatch.setattr(AssignFastPath, "answer", staticmethod(spy))
    rng = np.random.default_rng(0)
    queries = [rng.normal(0, 8, 3) for _ in range(60)]
    queries += [np.array(c) for c in converged["centroids"]]  # distance 0
    queries += [np.array([5.0, 0.5, 0.5]), np.array([1e-30, 0, 0]), np.array([3e30, 0, -1])]
    for q in queries:
        text = ",".join(repr(float(v)) for v in q)
        fast, route = fast_and_route(client, text)
        assert fast.status_code == route.status_code == 200
        assert fast.content == route.content, text
        assert fast.headers["content-type"] == route.headers["content-type"]
        assert fast.headers["content-length"] == route.headers["content-length"]
        assert fast.json()["version"] == converged["version"]
    # Every plain request was answered by the fast path, every other one by the route.
    assert answered == [True, False] * len(queries)


@pytest.mark.parametrize(
    "text", ["1,2", "1,x,3", "1,nan,3", "1,,3", "", " ", "1e999,0,0", "1;2;3", "1 2 3"]
)
def test_refused_vectors_get_the_routes_problem(
    client: TestClient, converged: dict, text: str
) -> None:
    fast, route = fast_and_route(client, text)
    assert fast.status_code == route.status_code == 422
    assert fast.headers["content-type"] == "application/problem+json"
    assert fast.json() == route.json()


def test_query_strings_that_are_not_one_vector_go_to_the_route(
    client: TestClient, converged: dict
) -> None:
    assert client.get("/assign").status_code == 422  # no vector at all
    both = client.get("/assign?vector=1,2,3&vector=0,0,0")
    assert both.status_code == 200  # the route picks one of them
    # '+' is a space and %2C a comma, for the fast path as for the route.
    for raw in ("1,+2,3", "1%2C2%2C3", "+1,2,3+"):
        fast, route = client.get(f"/assign?vector={raw}"), client.get(f"/assign?vector={raw}&x=")
        assert fast.status_code == 200 and fast.content == route.content


def test_no_model_yet_is_the_routes_409(client: TestClient) -> None:
    response = client.get("/assign?vector=1,2,3")
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"


def test_fast_answers_are_timed_as_assign(client: TestClient, converged: dict) -> None:
    for _ in range(3):
        assert client.get("/assign?vector=1,2,3").status_code == 200
    text = client.get("/metrics").text
    assert 'nmbatch_request_seconds_count{method="GET",route="/assign",status="200"} 3.0' in text


def test_reads_behind_an_api_key_are_checked(make_settings: SettingsFactory) -> None:
    settings: Settings = make_settings(api_key=KEY, api_key_reads=True)
    with TestClient(create_app(settings)) as client:
        auth = {"Authorization": f"Bearer {KEY}"}
        client.post("/samples", json={"vectors": POINTS.tolist()}, headers=auth)
        wait_converged(_Authed(client, auth), len(POINTS))  # type: ignore[arg-type]
        assert client.get("/assign?vector=1,2,3").status_code == 401
        assert client.get("/assign?vector=1,2,3", headers=auth).status_code == 200


class _Authed:
    """``client.get`` with the API key (what ``wait_converged`` calls)."""

    def __init__(self, client: TestClient, headers: dict[str, str]) -> None:
        self.client, self.headers = client, headers

    def get(self, url: str):  # type: ignore[no-untyped-def]
        return self.client.get(url, headers=self.headers)
