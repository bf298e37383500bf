"""deltawheel gc."""
