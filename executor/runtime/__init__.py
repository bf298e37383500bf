"""The per-batch protocol of a running computation: the executor, its reports, in-flight
deliveries, late-data marks, fault points, metrics, the injector hook and instances sharing
intervals. The drivers that run it are in ``executor/drivers/``, the sources in
``executor/sources/``, the local servers in ``executor/servers/``.
"""
