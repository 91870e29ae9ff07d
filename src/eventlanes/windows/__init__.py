"""Time windows decided by the log (issue 33's foundations): window kinds and the one start
formula (Python here, SQL in :mod:`.sql`, Spark in ``spark/windows.py``), durations and event
times as integer microseconds, the clocks that say which input is late and when a window
closes, and the semantics as a plain loop (:mod:`.reference`) that the engines are held to.

Not wired into aggregations yet: nothing here is public API.
"""
