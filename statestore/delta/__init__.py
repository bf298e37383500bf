"""Delta Lake at the protocol level: log reader, table files, transactions, the JVM seam.

It knows nothing of deltawheel's tables; those are built on it, one floor up.
"""
