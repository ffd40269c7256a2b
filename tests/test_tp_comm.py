"""Rank 0's collectives watch the workers: on a real two-rank gloo group, a collective a peer
never joins (a stopped process: gloo sees nothing) returns control every ``POLL`` so that a
dead worker fails the step in about a second instead of the collective timeout (a minute);
one the peer joins late still completes with the right result; the step message crosses as
sent."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

from paged_bench.distributed.comm import POLL, finish, receive_message, send_message  # noqa: E402
from paged_bench.distributed.group import free_port  # noqa: E402
from paged_bench.errors import EngineError  # noqa: E402


# the peers are forked from a server process that imported this module (torch) once, not each
# spawned to import it again: seconds a peer on a shared machine
PEERS = mp.get_context("forkserver")
PEERS.set_forkserver_preload([__name__])


def _peer(port: int, mode: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2,
                            timeout=timedelta(seconds=30))  # fmt: skip
    if mode == "late":
        time.sleep(1.2)
        dist.all_reduce(torch.ones(3))
    elif mode == "echo":  # receive one message, send back its length
        msg = receive_message(None)
        dist.all_reduce(torch.tensor([float(len(msg["tokens"]))]))
    else:
        time.sleep(60)  # stopped meanwhile: never joins
    dist.destroy_process_group()


@pytest.fixture
def group(request):
    port = free_port()
    peer = PEERS.Process(target=_peer, args=(port, request.param), daemon=True)
    peer.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
                            timeout=timedelta(seconds=30))  # fmt: skip
    try:
        yield peer
    finally:
        if peer.is_alive():
            os.kill(peer.pid, signal.SIGKILL)
        peer.join(5)
        dist.destroy_process_group()


@pytest.mark.parametrize("group", ["stopped"], indirect=True)
def test_a_collective_a_peer_never_joins_hands_back_to_the_watch(group):
    os.kill(group.pid, signal.SIGSTOP)  # alive, sockets open: gloo alone would wait 30 s
    looks = []

    def check_peers():
        looks.append(time.monotonic())
        if len(looks) == 3:
            raise EngineError("tensor-parallel worker tp-rank-1 exited with code -9")

    started = time.monotonic()
    with pytest.raises(EngineError, match="tp-rank-1"):
        finish(dist.all_reduce(torch.ones(3), async_op=True), check_peers)
    waited = time.monotonic() - started
    assert len(looks) == 3
    assert 2 * POLL.total_seconds() <= waited < 10  # three slices of POLL, not gloo's timeout


@pytest.mark.parametrize("group", ["late"], indirect=True)
def test_a_collective_joined_late_completes_with_its_result(group):
    looks = []
    x = torch.ones(3)
    finish(dist.all_reduce(x, async_op=True), lambda: looks.append(1))
    assert x.tolist() == [2.0, 2.0, 2.0]
    assert len(looks) >= 1  # it waited in slices, looking at the peer between them


@pytest.mark.parametrize("group", ["echo"], indirect=True)
def test_a_step_message_crosses_as_sent(group):
    send_message({"tokens": list(range(1000))}, None, lambda: None)
    n = torch.zeros(1)
    dist.all_reduce(n)
    assert n.item() == 1000.0


def test_a_broken_groups_teardown_does_not_wait_out_a_pending_collective():
    # gloo's teardown waits for pending collectives; one a lost peer never completes held a
    # failed run's close() for the whole collective timeout (60 s in CI)
    from paged_bench.distributed import group as tp_group

    port = free_port()
    peer = PEERS.Process(target=_peer, args=(port, "stopped"), daemon=True)
    peer.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
                            timeout=timedelta(seconds=30))  # fmt: skip
    try:
        os.kill(peer.pid, signal.SIGSTOP)  # its sockets stay open: the collective stays pending

        def worker_gone():
            raise EngineError("tensor-parallel worker tp-rank-1 exited with code -9")

        with pytest.raises(EngineError):
            finish(dist.all_reduce(torch.ones(3), async_op=True), worker_gone)
        started = time.monotonic()
        tp_group._destroy_group(broken=True)
        assert time.monotonic() - started < tp_group.STOP_GRACE_S + 2  # not gloo's 30 s
    finally:
        os.kill(peer.pid, signal.SIGKILL)  # the collective fails now, and the teardown ends
        peer.join(5)
    started = time.monotonic()
    tp_group._wait_for_teardown()  # what the next group in this process does first
    assert time.monotonic() - started < 10 and not dist.is_initialized()
