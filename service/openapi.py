"""OpenAPI pieces that several routes share: the vectors request body and its refusals.

``POST /samples`` and ``POST /assign`` (and their ``/models/{name}/...`` twins) take the
same bodies: JSON vectors, ``.npy`` or raw ``float32``. With ``NMBATCH_DIM`` set, the
app's document states the vectors' length (:func:`with_dimension`).
"""

from __future__ import annotations

from typing import Any

from nmbatch.service.parsing import JSON, NPY, OCTET
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import vectors_schema

__all__ = [
    "KEY_REFUSALS",
    "VECTORS_BODY",
    "VECTORS_REFUSED",
    "VERSION_NOT_KEPT",
    "vectors_body",
    "with_dimension",
    "with_key_refusals",
    "with_model_limits",
]

VECTORS_REFUSED = (
    "The vectors are refused; nothing is stored. `type` names the fault: "
    "`urn:nmbatch:problem:wrong-dimension` when a vector has another number of coordinates "
    "than the model's dimension (members `expected_dim` and `got_dim`; the dimension is "
    "NMBATCH_DIM when set, as `minItems`/`maxItems` of the JSON vectors say, else the "
    "first accepted batch fixes it for good), `dimension-too-large` (a first batch wider "
    "than NMBATCH_MAX_DIM), `non-finite` (NaN, infinity, or beyond float32), "
    "`non-numeric`, `not-a-matrix` (ragged or not 2-D), `empty`, `unknown-member`, "
    "`invalid-request` (a header or parameter), and under `metric=cosine` `zero-vector` (a "
    "vector of zeros has no direction; member `row`, the index of the first one)."
)
"""Description of the ``422`` answer of the operations whose body is vectors."""

VERSION_NOT_KEPT = (
    "`urn:nmbatch:problem:version-not-kept`: the version is not kept (never snapshotted, "
    "or forgotten past the bound), or (with the model's prefix) `unknown-model`; members "
    "`version` and `kept` (the kept versions)."
)
"""Description of the ``404`` answer of the operations that name a kept version."""


def vectors_body(dim: int | None = None) -> dict[str, Any]:
    """``openapi_extra`` of an operation whose body is vectors (JSON, ``.npy``, raw float32).

    With ``dim``, the JSON schema gives every vector exactly ``dim`` numbers.
    """
    return {
        "requestBody": {
            "required": True,
            "content": {
                JSON: {"schema": vectors_schema(dim)},
                NPY: {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "One 2-D real numeric array in NumPy .npy format.",
                    }
                },
                OCTET: {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "Raw little-endian float32, row-major, n x d values "
                        "(the model's dimension must be known).",
                    }
                },
            },
        }
    }


VECTORS_BODY = vectors_body()


def with_dimension(document: dict[str, Any], dim: int) -> dict[str, Any]:
    """``document`` (OpenAPI) with every vectors body (:data:`VECTORS_BODY`) of length ``dim``.

    The routers are built once per process, the dimension is a setting of each app: the
    app's ``openapi()`` passes its document through here (edited in place, returned).
    """
    body = vectors_body(dim)["requestBody"]
    for path, operations in document["paths"].items():
        if path.startswith("/models/"):  # named models: each has a dimension of its own
            continue
        for operation in operations.values():
            if operation.get("requestBody") == VECTORS_BODY["requestBody"]:
                operation["requestBody"] = body
    return document


KEY_REFUSALS = {
    401: "No API key, or one the service does not know (`urn:nmbatch:problem:unauthorized`, "
    "`WWW-Authenticate: Bearer`); only when the service has keys (and, for reads, "
    "NMBATCH_API_KEY_READS=true).",
    403: "The API key lacks the scope this operation needs (read, write or admin) or does "
    "not cover this model (`urn:nmbatch:problem:forbidden`, member `scope`).",
}
"""Descriptions of the answers to a request without a usable API key."""


def with_key_refusals(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (OpenAPI) with the ``401`` and ``403`` answers on every operation that
    takes the API key (its ``security`` names the bearer scheme); edited in place."""
    refusals = problem_responses(401, 403, described=KEY_REFUSALS)
    for operations in document["paths"].values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            if any("apiKey" in requirement for requirement in operation.get("security", [])):
                responses = operation.setdefault("responses", {})
                for status, answer in refusals.items():
                    known = responses.get(str(status))
                    if known is not None and known.get("description"):
                        # The operation's own refusal of that status (a 403 for a model
                        # another service owns) stays described beside the key's.
                        answer = answer | {
                            "description": f"{answer['description']} Or: {known['description']}"
                        }
                    responses[str(status)] = answer
    return document


def with_model_limits(document: dict[str, Any], max_dim: int) -> dict[str, Any]:
    """``document`` (OpenAPI) with the app's limit on a named model's dimension.

    ``PUT /models/{name}`` refuses a ``dim`` above ``NMBATCH_MAX_DIM`` (422
    ``dimension-too-large``): its body's ``dim`` gets that ``maximum`` (edited in place,
    returned).
    """
    operation = document["paths"].get("/models/{name}", {}).get("put")
    if operation is not None:
        schema = operation["requestBody"]["content"][JSON]["schema"]
        dim = schema["properties"]["dim"]
        dim["maximum"] = min(dim.get("maximum", max_dim), max_dim)
    return document
