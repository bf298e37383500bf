"""Steps 2-4 of the per-batch protocol as Spark jobs.

Shared by both write paths: the user-job contract (``job.py``), the input preparation in the
JVM (``input.py``), the loops that run user code (``usercode/``), the Python workers' set-up
(``worker.py``, ``daemon.py``) and the table of write paths (``paths.py``). One folder per write
path: ``image/`` (the job, its tasks, the per-interval run, the dedup, the direct read of input
files) and ``merge/`` (the job and its task function).
"""
