"""deltawheel statestore: everything about durable state, in floors.

A module imports from its own sub-package and the floors below, never from a higher floor, a
sibling sub-package, or anything outside statestore (``tests/test_layering.py``). From the ground
up: the modules in ``statestore/``; ``delta/``, ``zk/``; ``rowtable/``, ``objectstore/``;
``ownership/``; ``writepath/``; ``inspection/``; ``surgery/``; ``session/`` (docs/architecture.md).
A tool that only reads belongs in ``inspection/``; one that writes goes through ``ownership/``
and ``writepath/``."""
