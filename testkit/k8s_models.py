"""Kubernetes manifests checked against the API's own object schemas: each document validated
into its model from the ``kubernetes`` client (strict pydantic models generated from the
OpenAPI spec: unknown fields, missing required fields and wrong types all refused)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MODELS = {("batch/v1", "Job"): "V1Job", ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim"}


class ManifestError(ValueError):
    """A manifest its Kubernetes model refuses."""


def validate(doc: Mapping[str, Any]) -> Any:
    """The ``kubernetes.client`` model of ``doc``; :class:`ManifestError` where it refuses."""
    import pydantic
    from kubernetes import client

    key = (doc.get("apiVersion"), doc.get("kind"))
    name = MODELS.get(key)  # type: ignore[arg-type]
    if name is None:
        raise ManifestError(f"no model for apiVersion/kind {key}")
    try:
        return getattr(client, name).model_validate(dict(doc))
    except pydantic.ValidationError as exc:
        raise ManifestError(f"{key[1]}: {exc}") from None
