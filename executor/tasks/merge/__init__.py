"""The MERGE write path's Spark side; its writes are ``statestore/writepath/merge/``."""
