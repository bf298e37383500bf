"""deltawheel statestore: everything about durable state, in floors.

A module imports from its own sub-package and from the floors below its own, never from a
higher floor nor from another sub-package of its floor; nothing in statestore imports the
executor, the migrations, gc, the benchmarks or the package root, nor names one of their
modules in a string (``tests/test_layering.py`` checks all of it, imports inside functions
included). From the ground up:

- the modules directly in ``statestore/``: ``exceptions``, ``clock``, ``config``, ``codecs``,
  ``layout``, ``process`` (local server processes and the ``java`` they run on), ``jars``
  (fetching and building jars), ``sqltext`` and ``comments`` (the SQL text of the tables and
  what each column means, written by whoever creates a table);
- ``delta/`` (Delta Lake at the protocol level: the log, transactions, files, the JVM seam) and
  ``zk/`` (coordination in ZooKeeper: the client, leases and sequencers, watermarks);
- ``rowtable/`` (the rows table on Delta) and ``objectstore/`` (S3 through ``s3a://``);
- ``ownership/`` (lease -> fence -> recovery: ZooKeeper and the rows table together);
- ``writepath/`` (every write of the rows and stream tables, through an interval owner);
- ``inspection/`` (read-only: the SQL views, the damage check);
- ``surgery/`` (a tool's fenced replacing write of a live computation's rows under its leases, and
  the audit table: promote, repair);
- ``session/`` (building and checking a SparkSession for all of the above).

A tool that only reads the tables belongs in ``inspection/``; one that writes them takes the
leases of what it touches through ``ownership/`` and commits through ``writepath/`` (``surgery/``
does both for a tool that replaces some intervals' rows).
"""
