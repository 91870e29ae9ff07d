"""The log records of `run --processes` workers, sent to the supervisor down their pipes."""

from __future__ import annotations

import logging
import multiprocessing as mp

from eventlanes.cli.logs import WorkerLogs, setup_worker

BIG = "x" * 5000  # over PIPE_BUF: a record written in several parts


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
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith("worker 1 record 3 "):
                raise RuntimeError("this handler fails once")
            seen.append(message)

    root = logging.getLogger()
    handler = Collect()
    root.addHandler(handler)
    try:
        ctx = mp.get_context("spawn")
        logs = WorkerLogs(ctx)
        procs = []
        for worker in range(2):
            channel = logs.channel()
            proc = ctx.Process(target=_child, args=(channel, worker, 50))
            proc.start()
            channel.close()
            procs.append(proc)
        for proc in procs:
            proc.join(30)
        alive = [p.pid for p in procs if p.is_alive()]
        for proc in procs:
            proc.kill()
        logs.close()
    finally:
        root.removeHandler(handler)
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
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root = logging.getLogger()
    handler = Collect()
    root.addHandler(handler)
    try:
        ctx = mp.get_context("spawn")
        logs = WorkerLogs(ctx)
        channel = logs.channel()
        proc = ctx.Process(target=_child_with_a_ghost, args=(channel,))
        proc.start()
        channel.close()
        proc.join(30)
        logs.close()
    finally:
        root.removeHandler(handler)
    assert proc.exitcode == 0
    assert [m for m in seen if m in ("before", "haunted", "after")] == ["before", "after"]
