"""What runs computations for a user: :func:`~.engine.connect`, pipelines, runners and tools."""
