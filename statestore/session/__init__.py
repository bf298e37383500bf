"""Session set-up, the top floor of statestore: building and checking a SparkSession, connector jars."""
