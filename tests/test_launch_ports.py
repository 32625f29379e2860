"""free_port(): a store port outside the kernel's ephemeral range, where gloo's own connections are given theirs."""

import socket

from ddpwatch import launch


def test_the_port_comes_from_below_the_ephemeral_range_and_can_be_listened_on(monkeypatch):
    monkeypatch.setattr(launch, "_ephemeral_low", lambda: 32768)
    ports = {launch.free_port() for _ in range(20)}
    assert all(launch.FIXED_PORTS_FROM <= port < 32768 for port in ports), ports
    assert len(ports) > 1  # picked at random: two jobs started together do not ask for the same one
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", ports.pop()))


def test_a_port_someone_listens_on_is_never_given(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(launch, "FIXED_PORTS_FROM", taken)
        monkeypatch.setattr(launch, "_ephemeral_low", lambda: taken + 1000)
        other = next(port for port in range(taken + 1, taken + 1000) if launch._bindable(port))
        choices = iter([taken, taken, other])
        monkeypatch.setattr(
            launch.random, "Random", lambda seed: type("R", (), {"randrange": lambda s, a, b: next(choices)})()
        )
        assert launch.free_port() == other


def test_without_room_below_the_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(launch, "_ephemeral_low", lambda: 1024)
    port = launch.free_port()
    assert 0 < port < 65536
