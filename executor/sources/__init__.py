"""The sources of a pipeline: the injector contract and the Parquet, Delta, JSON Lines and Kafka injectors."""
