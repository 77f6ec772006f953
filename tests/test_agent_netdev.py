"""The agent's reading of the container's traffic (agent/netdev.py), from /proc/net/dev text."""

from __future__ import annotations

from agent.netdev import NetCounter, parse

PROC_NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 112246287   14920    0    0    0     0          0         0 112246287   14920    0    0    0     0       0          0
  eth0: 339211325    8451    0    0    0     0          0         0   434862    4334    0    0    0     0       0          0
  eth1:1000 3 0 0 0 0 0 0 20 1 0 0 0 0 0 0
"""  # noqa: E501 (the kernel's own line lengths; eth1 as printed when the number touches the colon)


def net_dev(eth0: tuple[int, int], *more: str) -> str:
    header = "\n".join(PROC_NET_DEV.splitlines()[:3])
    rx, tx = eth0
    return f"{header}\n  eth0: {rx} 1 0 0 0 0 0 0 {tx} 1 0 0 0 0 0 0\n" + "".join(more)


def test_it_reads_bytes_each_way_per_interface_without_the_loopback():
    assert parse(PROC_NET_DEV) == {"eth0": (339211325, 434862), "eth1": (1000, 20)}


def test_header_and_garbled_lines_are_skipped():
    assert parse("Inter-|   Receive\n face |bytes\n  eth0: x y\n  wg0: 5\n") == {}


def test_the_counter_reports_what_moved_since_it_was_made(tmp_path):
    path = tmp_path / "net_dev"
    path.write_text(net_dev((10_000, 500)))  # before the agent: the bootstrap's download
    counter = NetCounter(path)

    path.write_text(net_dev((10_000 + 3_000_000, 500 + 4_000)))

    assert counter.sample() == (3_000_000, 4_000)


def test_a_reset_interface_and_a_new_one_count_from_their_own_zero(tmp_path):
    path = tmp_path / "net_dev"
    path.write_text(net_dev((10_000, 500)))
    counter = NetCounter(path)
    path.write_text(net_dev((12_000, 700)))
    assert counter.sample() == (2_000, 200)

    path.write_text(net_dev((300, 30), "  wg0: 50 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n"))

    assert counter.sample() == (2_000 + 300 + 50, 200 + 30 + 5)


def test_no_counters_is_none_not_zero(tmp_path):
    counter = NetCounter(tmp_path / "missing")

    assert counter.sample() is None


def test_nomad_net_dev_points_at_another_file(tmp_path, monkeypatch):
    path = tmp_path / "instance_net_dev"
    path.write_text(net_dev((0, 0)))
    monkeypatch.setenv("NOMAD_NET_DEV", str(path))

    assert NetCounter().path == path
