"""Delta Lake at the protocol level: a Python reader of a table's Delta log (:mod:`.log`), the
table's files as Python reaches them, local or ``s3a://`` (:mod:`.storefs`), fenced transactions
through Delta's own API (:mod:`.txn`), and the one seam into pyspark's JVM handles (:mod:`.jvm`).
It knows nothing of deltawheel's tables: the rows table, the streams and the views are built
on it, one floor up.
"""
