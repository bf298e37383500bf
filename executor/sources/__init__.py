"""The sources of a pipeline: the injector contract (``injector.py``), the stream-table columns
(``schema.py``), the injectors of Parquet folders, Delta tables, JSON Lines folders and Kafka
topics, and MillWheel's pending-input watermark estimate (``estimates.py``).
"""
