"""Server processes for users and tests: ZooKeeper (``zookeeper.py``, ``ensemble.py``, a store's own:
``embedded.py``), S3Proxy, Kafka, Toxiproxy, a Spark standalone cluster and a hosts test bed."""
