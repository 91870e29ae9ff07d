"""Time windows decided by the log: window kinds and the one start formula (Python here, SQL
in :mod:`.sql`, Spark in ``spark/windows.py``), durations and event times as integer
microseconds, the clocks that say which input is late and when a window closes, what a
windowed aggregation is asked for and answers (:mod:`.spec`), and the semantics as a plain
loop (:mod:`.reference`) that the engines are held to. The engine's part is
``processing/windowing``.
"""
