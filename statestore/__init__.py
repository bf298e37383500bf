"""deltawheel statestore: everything about durable state, in floors (docs/architecture.md).

A module imports from its own sub-package and the floors below, never from a higher floor, a
sibling sub-package, or anything outside statestore (``tests/test_layering.py``)."""
