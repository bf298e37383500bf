"""The driver side of a running computation: the per-batch protocol, pipelines, sources and
injectors, late-data marks, fault points, reports and the recovery tool.
"""
