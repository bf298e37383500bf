"""Running user code in the tasks, on both write paths: per key and record (:mod:`.keyrun`: what
user code sees; :mod:`.keys`: an interval's keys column-wise), vectorised (:mod:`.combine`,
:mod:`.vector`: one ``combine`` over many keys) and columnar (:mod:`.columnar`: one
``process_columns`` over an interval's keys).
"""
