"""Connection fairness at the cap against a real `ferry serve`: a few addresses holding every connection with
silent sockets no longer keep a client from another address out. Loopback only: the sockets come from 127.0.0.x
source addresses (all of 127/8 is the loopback on Linux)."""
import socket
import time

import pytest
from conftest import Server, recv_all

ADDRS, PER_ADDR = 16, 16


def open_silent(src, port, n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def get_from(src, url, timeout):
    """GET url from the source address src, on a fresh connection; returns (status, seconds)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout, source_address=(src, 0))
    t0 = time.time()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = recv_all(s)
    s.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None, time.time() - t0


@pytest.fixture
def capped():
    cap = ADDRS * PER_ADDR
    s = Server("--max-connections", str(cap), "--max-connections-per-ip", str(PER_ADDR), "--header-timeout", "60",
               "--conn-timeout", "60")
    yield s
    assert s.stop() == 0, s.read_log()


def test_a_new_address_is_served_at_the_cap(capped):
    socks = []
    try:
        try:
            for a in range(ADDRS):
                socks += open_silent(f"127.0.0.{a + 2}", capped.port, PER_ADDR)
        except OSError as e:
            pytest.skip(f"cannot bind 127.0.0.x source addresses here: {e}")
        deadline = time.time() + 10
        while time.time() < deadline and capped.metrics()["ferry_http_connections_open"] < ADDRS * PER_ADDR - 1:
            time.sleep(0.05)
        # (the metrics request itself took a connection of 127.0.0.1 while it ran)
        for i in range(3):  # a 17th address, three times over: each gets its answer within a second
            st, took = get_from(f"127.0.0.{ADDRS + 2 + i}", capped.url, timeout=5)
            assert st == 200 and took < 1.0, (st, took)
        m = capped.metrics()
        assert m["ferry_http_connections_evicted_total"] >= 1, m  # (a newcomer that left frees its place)
    finally:
        for s in socks:
            s.close()


def test_one_address_alone_is_still_refused_at_the_cap(capped):
    """The cap still holds against a flood from one address: it has nobody to take a connection from."""
    socks = []
    try:
        socks = open_silent("127.0.0.2", capped.port, PER_ADDR)
        st, _ = get_from("127.0.0.2", capped.url, timeout=5)
        assert st == 503  # --max-connections-per-ip
    finally:
        for s in socks:
            s.close()
