"""What starts a server process for a user or a test: an embedded ZooKeeper server
(``zookeeper.py``) and a local ensemble of them (``ensemble.py``), a local store's own ZooKeeper
(``embedded.py``), S3Proxy as a local S3-compatible store (``s3proxy.py``), a single-node Kafka
broker (``kafka.py``) and a local Spark standalone cluster (``cluster.py``).
"""
