"""Running user code in the tasks: per key, vectorised and columnar."""
