"""Events as Arrow columns without a Python object per event (pyarrow, the ``arrow`` extra):
their JSON data's properties as typed columns, exact or not at all (:mod:`.json`), and the
local engine's declarative folds over them (:mod:`.fold`)."""
