"""Which executor runs a processor's batches: chosen in one place, by what it is.

| processor | executor | guarantee |
|---|---|---|
| ``app.aggregation`` | :class:`~.aggregation.AggregationWorker` | states + token, deduped |
| ``app.republisher`` | :class:`~.republisher.RepublishWorker` | at-least-once appends |
| ``guarantee="at-least-once"`` | :class:`~.lanes.LaneWorker` | handlers outside the token's tx |
| ``guarantee="exactly-once"`` | :class:`~.worker.SegmentWorker` | handlers' writes + token |
"""

from __future__ import annotations

from .aggregation import Aggregation, AggregationWorker
from .lanes import LaneWorker
from .processor import Guarantee, Processor
from .republisher import Republisher, RepublishWorker
from .runtime import Runtime
from .worker import SegmentWorker


def executor_for(runtime: Runtime, proc: Processor, owner: str) -> SegmentWorker:
    if isinstance(proc, Aggregation):
        return AggregationWorker(runtime, proc, owner)
    if isinstance(proc, Republisher):
        return RepublishWorker(runtime, proc, owner)
    if proc.guarantee is Guarantee.AT_LEAST_ONCE:
        return LaneWorker(runtime, proc, owner)
    return SegmentWorker(runtime, proc, owner)
