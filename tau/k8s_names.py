"""Kubernetes naming rules, shared by the tau.yaml schema and the server's models."""

from __future__ import annotations

import re
from typing import Final

#: The resource name NVIDIA's device plugin gives GPUs, in quotas, requests and node capacity.
GPU_RESOURCE: Final = "nvidia.com/gpu"

# The checks below use ``fullmatch``: with ``match``, ``$`` also matches before a trailing
# newline, so "name\n" would pass as a valid label.

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def dns1123_label_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 label (namespaces, most object names), or None."""
    if len(value) > 63:
        return f"must be at most 63 characters (it has {len(value)})"
    if not DNS1123_LABEL.fullmatch(value):
        return (
            "must be lower-case letters, digits and '-', starting and ending with a letter or digit"
        )
    return None


def dns1035_label_problem(value: str, *, max_length: int = 63) -> str | None:
    """Why ``value`` is not a DNS-1035 label (Service and RayJob names), or None."""
    if len(value) > max_length:
        return f"must be at most {max_length} characters (it has {len(value)})"
    if not DNS1035_LABEL.fullmatch(value):
        return (
            "must be lower-case letters, digits and '-', "
            "start with a letter and end with a letter or digit"
        )
    return None


def dns1123_subdomain_problem(value: str) -> str | None:
    if len(value) > 253:
        return f"must be at most 253 characters (it has {len(value)})"
    if not DNS1123_SUBDOMAIN.fullmatch(value):
        return (
            "must be lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (``[prefix/]name``), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return "has an empty prefix before '/'"
        problem = dns1123_subdomain_problem(prefix)
        if problem:
            return f"prefix {prefix!r} {problem}"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        return (
            "name part must be 1-63 characters of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        return (
            "must be at most 63 characters of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a resource name such as ``cpu``, ``memory`` or ``nvidia.com/gpu``."""
    return label_key_problem(name)
