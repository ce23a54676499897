"""The ports chosen for servers that bind them later (the control plane's components, a local
Ray cluster's nodes) come from outside the kernel's ephemeral range: there, any process's
``bind(0)`` or outgoing connection may take a port between its choice and the server's bind
(CI once lost the KubeRay operator's health port in the 34 s of a CRD install)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tau import ray_cluster
from tests.cluster.plugin import load_controlplane

CHOOSERS = {"controlplane": load_controlplane(), "ray_cluster": ray_cluster}


@pytest.fixture(params=sorted(CHOOSERS))
def chooser(request: pytest.FixtureRequest) -> ModuleType:
    return CHOOSERS[request.param]


def test_ports_are_distinct_free_and_below_the_ephemeral_range(chooser: ModuleType) -> None:
    low = chooser._ephemeral_low()
    ports = chooser.free_ports(20)
    assert len(set(ports)) == 20
    assert all(20000 <= port < low for port in ports), (ports, low)
    for port in ports:  # each can be listened on now
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_chosen(
    chooser: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range that starts at a port another process listens on: that one is skipped."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(chooser, "_LISTEN_FLOOR", busy)
        monkeypatch.setattr(chooser, "_ephemeral_low", lambda: busy + 1000)
        ports = chooser.free_ports(3)
    assert busy not in ports
    assert len(set(ports)) == 3


def test_without_room_below_the_range_the_kernel_chooses(
    chooser: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chooser, "_ephemeral_low", lambda: 20500)  # 500 ports: too few
    ports = chooser.free_ports(4)
    assert len(set(ports)) == 4
    assert all(port >= 20500 or port < 20000 for port in ports)


@pytest.mark.parametrize(
    ("text", "low"), [("15000\t60999\n", 15000), ("", 32768), ("garbage", 32768)]
)
def test_the_ephemeral_range_is_read_from_the_kernel(
    chooser: ModuleType, tmp_path: Path, text: str, low: int
) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    read: Callable[[Path], int] = chooser._ephemeral_low
    assert read(path) == low
    assert read(tmp_path / "missing") == 32768
