"""deltawheel statestore: everything about durable state, in floors.

A module imports from its own sub-package and from the floors below its own, never from a
higher floor nor from another sub-package of its floor; nothing in statestore imports the
executor, the migrations, gc, the benchmarks or the package root, nor names one of their
modules in a string (``tests/test_layering.py`` checks all of it, imports inside functions
included). From the ground up: the modules directly in ``statestore/``; ``delta/`` and ``zk/``;
``rowtable/`` and ``objectstore/``; ``ownership/``; ``writepath/``; ``inspection/``;
``surgery/``; ``session/`` (what each holds: docs/architecture.md, "statestore's floors").

A tool that only reads the tables belongs in ``inspection/``; one that writes them takes the
leases of what it touches through ``ownership/`` and commits through ``writepath/`` (``surgery/``
does both for a tool that replaces some intervals' rows).
"""
