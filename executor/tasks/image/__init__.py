"""The image write path's Spark side; its writes are ``statestore/writepath/image/``."""
