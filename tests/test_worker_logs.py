"""The log records of `run --processes` workers, sent to the supervisor down their pipes."""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any

from eventlanes.cli.logs import WorkerLogs, setup_worker

BIG = "x" * 5000  # over PIPE_BUF: a record written in several parts
SPAWN = mp.get_context("spawn")


@contextmanager
def _collected(fails_on: str | None = None) -> Iterator[list[str]]:
    """The messages the supervisor's handlers get, while the block runs; a handler that
    raises on the message starting with ``fails_on``."""
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if fails_on is not None and message.startswith(fails_on):
                raise RuntimeError("this handler fails once")
            seen.append(message)

    root = logging.getLogger()
    handler = Collect()
    root.addHandler(handler)
    try:
        yield seen
    finally:
        root.removeHandler(handler)


def _worker(logs: WorkerLogs, target: Callable[..., None], *args: Any) -> BaseProcess:
    """A worker process started with its own pipe (closed here once it runs, as the
    supervisor does)."""
    channel = logs.channel()
    proc = SPAWN.Process(target=target, args=(channel, *args))
    proc.start()
    channel.close()
    return proc


def _child(channel, worker: int, records: int) -> None:
    setup_worker(channel, "info")
    log = logging.getLogger("eventlanes.test")
    for i in range(records):
        log.warning("worker %d record %d %s", worker, i, BIG)


def test_records_arrive_whole_in_order_and_a_failing_handler_does_not_stop_them() -> None:
    """Two workers send 50 records of 5 KB each (more than a pipe holds). A handler of the
    supervisor fails on one record: that one is lost, and every other record still arrives,
    whole and in each worker's order (a listener thread ended by the failure would leave
    the workers blocked on full pipes)."""
    with _collected(fails_on="worker 1 record 3 ") as seen:
        logs = WorkerLogs(SPAWN)
        procs = [_worker(logs, _child, worker, 50) for worker in range(2)]
        for proc in procs:
            proc.join(30)
        alive = [p.pid for p in procs if p.is_alive()]
        for proc in procs:
            proc.kill()
        logs.close()
    assert not alive, "workers blocked on their pipes: the listener stopped reading"
    for worker in range(2):
        mine = [m for m in seen if m.startswith(f"worker {worker} ")]
        expected = [f"worker {worker} record {i} {BIG}" for i in range(50)
                    if (worker, i) != (1, 3)]  # fmt: skip
        assert mine == expected


def _child_with_a_ghost(channel) -> None:
    import sys
    import types

    setup_worker(channel, "info")
    ghost = types.ModuleType("eventlanes_test_ghost")  # exists in this process only
    exec("class Ghost:\n    pass\n", ghost.__dict__)
    sys.modules[ghost.__name__] = ghost
    log = logging.getLogger("eventlanes.test")
    log.warning("before")
    log.warning("haunted", extra={"ghost": ghost.Ghost()})  # the supervisor cannot load it
    log.warning("after")


def test_a_record_the_supervisor_cannot_load_is_lost_alone() -> None:
    """A record whose ``extra`` holds an object of a class only the worker has: that record
    is lost (said on stderr), and the worker's next records still arrive (before, its pipe
    was dropped and every later record went to the worker's stderr)."""
    with _collected() as seen:
        logs = WorkerLogs(SPAWN)
        proc = _worker(logs, _child_with_a_ghost)
        proc.join(30)
        logs.close()
    assert proc.exitcode == 0
    assert [m for m in seen if m in ("before", "haunted", "after")] == ["before", "after"]


def _child_that_forks(channel) -> None:
    import os
    import threading

    sender = setup_worker(channel, "info")
    log = logging.getLogger("eventlanes.test")
    log.warning("parent before")
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:  # another thread in the middle of sending when the fork happens
        with sender.lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the forked child: a handler's own fork (a fork-based pool, say)
        log.warning("child %s", BIG)
        os._exit(0)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    log.warning("child exited %d", os.waitstatus_to_exitcode(status))
    log.warning("parent after %s", BIG)


def test_a_process_forked_by_a_worker_does_not_write_into_its_pipe() -> None:
    """A worker's handler forks (a fork-based pool) while another of its threads sends a
    record. Before: the child inherited the pipe and its lock, held for ever in the child,
    so its first log call hung (or, with the lock free, wrote into the worker's pipe beside
    the worker, cutting records over PIPE_BUF). Now the child logs to its own stderr, and
    the worker's records arrive whole."""
    with _collected() as seen:
        logs = WorkerLogs(SPAWN)
        proc = _worker(logs, _child_that_forks)
        proc.join(30)
        alive = proc.is_alive()
        proc.kill()
        logs.close()
    assert not alive, "the forked child hung on the lock it inherited"
    assert [m.split(" ")[0] + " " + m.split(" ")[1] for m in seen
            if m.startswith(("parent", "child"))] == [
        "parent before", "child exited", "parent after"
    ]  # fmt: skip
    assert "child exited 0" in seen
