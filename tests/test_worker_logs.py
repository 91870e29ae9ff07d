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
