"""The drivers of a running computation (``connect`` and the engine, pipelines, the recovery
tool), its sources and injectors, and the local servers; the per-batch protocol is in
:mod:`deltawheel.executor.protocol`.
"""
