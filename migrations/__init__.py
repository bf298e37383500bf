"""deltawheel migrations."""
