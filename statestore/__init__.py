"""deltawheel statestore."""
