"""Idle time as an event. When a windowed aggregation's inputs stop, its clock stops and its
last windows never close. With ``idle_close=`` its workers append a tick (an event of type
:data:`TICK` to stream :data:`TICK_STREAM`) once no input nor tick came for that long; the
store clock takes a tick's ``recorded_at`` less ``tick_lag`` as one more time. A tick is in the
log like any event, so every segment count, restart and replay sees the same closes (a wall
clock read while folding would differ from run to run).

Ticks are read only where asked for: a handler of every type (``on()`` with no type, folds of
every type) is never given one; ``on(TICK)`` names them.
"""

from __future__ import annotations

#: the type of a tick event (its data is empty: its time is its ``recorded_at``)
TICK = "$clock.tick"
#: the stream ticks are appended to, each at the version the ticker read (two tickers that
#: find the store idle at once append one tick: the other's append is refused)
TICK_STREAM = "$clock"
