"""deltawheel executor."""
