"""What starts a server process for a user or a test: a local store's embedded ZooKeeper
(``embedded.py``), a single-node Kafka broker (``kafka.py``) and a local Spark standalone cluster
with a ZooKeeper ensemble (``cluster.py``).
"""
