"""The one spelling of a decoded JSON object (a Kubernetes body, an admin API reply, a wire
frame's payload) used across the project."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JsonObj = dict[str, Any]
"""A decoded JSON object this code may change."""

JsonView = Mapping[str, Any]
"""A JSON object only read: kopf hands handlers ``kopf.Body``, a Mapping rather than a dict."""
