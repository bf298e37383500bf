"""deltawheel benchmarks."""
