"""The small shared helpers of milarun.host: each concept written once."""

import socket

import pytest

from milarun.host import accel
from milarun.host.net import free_port


def test_free_port_can_be_bound():
    port = free_port("127.0.0.1")
    assert 1 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_port_default_when_none_can_be_had():
    # an address this host does not have: binding fails
    assert free_port("192.0.2.1", default=29400) == 29400
    with pytest.raises(OSError):
        free_port("192.0.2.1")


def test_gpu_backends_follow_the_one_discovery_order():
    assert accel.GPU_BACKENDS == ("nvidia", "amd", "intel")
    order = list(accel.BACKENDS)
    assert [order.index(n) for n in accel.GPU_BACKENDS] == sorted(
        order.index(n) for n in accel.GPU_BACKENDS)
