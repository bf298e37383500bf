"""Server processes for users and tests: embedded ZooKeeper (``zookeeper.py``) and local ensembles
of it (``ensemble.py``), a local store's own ZooKeeper (``embedded.py``), S3Proxy (``s3proxy.py``),
a Kafka broker (``kafka.py``) and a Spark standalone cluster (``cluster.py``)."""
