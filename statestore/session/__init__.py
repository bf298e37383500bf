"""Session set-up, the top floor of statestore: building and checking a SparkSession for
deltawheel (:mod:`.sparkenv`: Delta Lake's jars and settings, deltawheel's log stores, the S3A
jars, Java) and Spark's Kafka connector jars (:mod:`.connectors`).
"""
