"""What runs computations for a user: :func:`~.engine.connect` and the :class:`~.engine.Engine`
(``engine.py``), a :class:`~.pipeline.Pipeline` (``pipeline.py``) and its
:class:`~.runner.PipelineRunner` (``runner.py``), the recovery tool (``recover.py``), and the one
place their objects are composed (``wiring.py``).
"""
