"""The per-batch protocol of one computation: :class:`~.executor.ComputationExecutor` (the
lifecycle a caller drives: start, the ``foreachBatch`` entry, settle, stop) and its companions --
the batch reports, the deliveries still in flight, the durable lateness mark, the fault points,
the per-batch metrics, the injectors' end-of-batch hook and the skip rule of shared intervals.
"""
