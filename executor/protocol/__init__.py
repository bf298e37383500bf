"""The per-batch protocol of one computation.

``executor.py``: :class:`~.executor.ComputationExecutor`, the lifecycle a caller drives (start,
the ``foreachBatch`` entry, settle, stop); ``batch.py``: :class:`~.batch.BatchProtocol`, DESIGN's
seven steps on one micro-batch; ``watermarks.py``: what a batch reads from and publishes to the
watermark authority; and the companions: the batch reports (``reports.py``), the deliveries still
in flight (``inflight.py``), the durable lateness mark (``lateness.py``), the fault points
(``faults.py``), the per-batch metrics (``metrics.py``), the injectors' end-of-batch hook
(``hooks.py``), the skip rule of shared intervals (``rescale.py``), a start in a thread
(``starting.py``).
"""
