"""Starting, driving and stopping the tensor-parallel worker processes.

Rank 0 is the engine's own process (as vLLM's driver worker): it builds its slice, spawns
ranks 1..N-1, waits until each has built its slice (failing fast, with the worker's error,
if one dies first), then joins them in a process group on a free localhost port: gloo on
CPU, NCCL on CUDA (with a gloo group beside it for the step messages). Each step it
broadcasts the plan, then does its own share (the torch backend's step, on its slice); while
it waits on a gloo collective it looks at the workers, so a dead one fails the step within a
second (``comm``).

Stopping: ``close`` broadcasts ``Stop``, waits a few seconds, then terminates and kills what
is left. Workers ignore Ctrl-C (rank 0 stops them), exit when their parent process is gone,
and exit on any failed collective, so none outlives the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from paged_bench.distributed.comm import TPComm, receive_message, send_message
from paged_bench.distributed.rank import Bind, Follower, Message, ModelSpec, RankModel, Step, Stop, rank_device
from paged_bench.errors import EngineError

START_TIMEOUT_S = 120.0  # a worker builds its weights in this long, or the start fails
COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a step's collectives; a dead peer fails sooner
STOP_GRACE_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_group(spec: ModelSpec, rank: int, world_size: int, port: int) -> Any:
    """Join the process group; the group the step messages travel on (gloo even beside NCCL)."""
    backend = "nccl" if spec.device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank_device(spec, rank))
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )
    return dist.new_group(backend="gloo") if backend == "nccl" else None


def _set_threads(spec: ModelSpec, world_size: int) -> None:
    # the ranks share the host's cores: default to an equal share each
    torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // world_size))


def worker_main(rank: int, world_size: int, port: int, spec: ModelSpec, ready: Any) -> None:
    """A worker process: build the slice, report, join the group, serve messages until Stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches rank 0, which stops us
    _exit_with_parent(os.getppid())
    _set_threads(spec, world_size)
    try:
        model = RankModel(spec, rank, world_size)
    except BaseException as e:
        ready.put((rank, f"{type(e).__name__}: {e}"))
        raise
    ready.put((rank, None))
    group = _init_group(spec, rank, world_size, port)
    model.comm = TPComm(rank, world_size, spec.model.vocab_size)
    follower = Follower(model)
    try:
        while True:
            msg = receive_message(group)
            if isinstance(msg, Stop):
                break
            if isinstance(msg, Bind):
                model.bind(msg)
            elif isinstance(msg, Step):
                follower.step(msg)
    finally:
        dist.destroy_process_group()


def _destroy_group(broken: bool) -> None:
    """Leave the process group. Gloo's teardown waits for the collectives still pending, and one
    a dead peer left pending can wait out the whole collective timeout (a minute, seen in CI):
    a broken group's teardown goes on in a thread of its own, waited on for a moment only."""
    global _teardown
    if _teardown is not None and _teardown.is_alive():  # already on its way out
        return
    if not broken:
        dist.destroy_process_group()
        return
    _teardown = threading.Thread(target=dist.destroy_process_group, daemon=True, name="tp-teardown")
    _teardown.start()
    _teardown.join(STOP_GRACE_S)


def _wait_for_teardown() -> None:
    """A new group in this process waits until an earlier broken one is gone."""
    if _teardown is not None:
        _teardown.join(COLLECTIVE_TIMEOUT.total_seconds() + STOP_GRACE_S)


_teardown: threading.Thread | None = None  # a broken group's teardown (_destroy_group)


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="tp-parent-watch").start()


@contextmanager
def _spawning(ctx: Any) -> Iterator[None]:
    """Start workers as fresh spawned interpreters whatever the process around us set up:
    Ctrl-C ignored until ``worker_main`` ignores it itself (a worker still importing torch
    printed a KeyboardInterrupt traceback; the ignore survives exec), and spawn as the start
    method the child is told to set (it is told the process-wide one: inside a joblib sweep
    job that is loky's, which a fresh interpreter cannot find, and every worker died)."""
    default = mp.context._default_context  # what spawn's preparation data reads the method from
    saved_method = default._actual_context
    main = threading.current_thread() is threading.main_thread()
    saved_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    default._actual_context = ctx
    try:
        yield
    finally:
        default._actual_context = saved_method
        if main:
            signal.signal(signal.SIGINT, saved_sigint)


class TPGroup:
    """Rank 0's handle on the group: ``send`` broadcasts a message to the workers; rank 0's own
    share runs inside ``guard`` so that a failed collective fails the run, not hangs it."""

    def __init__(self, spec: ModelSpec, world_size: int) -> None:
        self.world_size = world_size
        _wait_for_teardown()
        self.model = RankModel(spec, 0, world_size)  # a bad checkpoint fails here, before any spawn
        ctx = mp.get_context("spawn")
        port, ready = free_port(), ctx.Queue()
        self.workers = [
            ctx.Process(target=worker_main, args=(r, world_size, port, spec, ready), daemon=True, name=f"tp-rank-{r}")
            for r in range(1, world_size)
        ]
        self._group: Any = None
        self._joined = False
        self._broken = False  # True once a step failed midway
        try:
            with _spawning(ctx):
                for w in self.workers:
                    w.start()
            self._wait_ready(ready)
            self._group = _init_group(spec, 0, world_size, port)
            self._joined = True
        except BaseException:
            self.close()
            raise
        # on CPU rank 0's collectives watch the workers; NCCL's are not waited on by the CPU
        watch = self.check_workers if spec.device_type == "cpu" else None
        self.model.comm = TPComm(0, world_size, spec.model.vocab_size, watch)

    def check_workers(self) -> None:
        """Raise if a worker process has exited (rank 0 calls it while a collective waits)."""
        for w in self.workers:
            if not w.is_alive():
                raise EngineError(f"tensor-parallel worker {w.name} exited with code {w.exitcode}")

    def _wait_ready(self, ready: Any) -> None:
        pending, deadline = set(range(1, self.world_size)), time.monotonic() + START_TIMEOUT_S
        while pending:
            try:
                rank, error = ready.get(timeout=0.2)
            except queue.Empty:  # look at the workers, then wait on
                self.check_workers()
                if time.monotonic() > deadline:
                    raise EngineError(f"tensor-parallel workers {sorted(pending)} not ready in {START_TIMEOUT_S:.0f} s")
                continue
            if error is not None:
                raise EngineError(f"tensor-parallel rank {rank} failed to build its slice: {error}")
            pending.discard(rank)

    def send(self, msg: Message) -> None:
        send_message(msg, self._group, self.check_workers)

    @contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except BaseException as e:
            # the ranks may now wait in different collectives: no Stop message can reach them
            self._broken = True
            if isinstance(e, RuntimeError):  # gloo/NCCL: a peer died or timed out
                raise EngineError(f"tensor-parallel step failed: {str(e).splitlines()[0]}") from e
            raise

    def bind(self, msg: Bind) -> None:
        with self.guard():
            self.send(msg)
            self.model.bind(msg)

    def close(self) -> None:
        """Stop every worker; idempotent, and safe after a failure at any point (a worker that
        does not stop on the message within a few seconds is terminated, then killed)."""
        if self._joined and not self._broken:
            try:
                self.send(Stop())
            except Exception:  # noqa: BLE001  (a broken group: the workers exit on their own, or are killed)
                traceback.print_exc(limit=0)
        self._joined = False
        grace = STOP_GRACE_S if not self._broken else 0.0
        deadline = time.monotonic() + grace
        for w in self.workers:
            if w.pid is not None:
                w.join(max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            if w.is_alive():
                w.terminate()
                w.join(2.0)
            if w.is_alive():
                w.kill()
                w.join(2.0)
        if dist.is_initialized():
            _destroy_group(self._broken)
