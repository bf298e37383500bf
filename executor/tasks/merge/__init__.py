"""The MERGE write path's Spark side: its batch job (:mod:`.job`) and the task function that runs
user code per key (:mod:`.task`); its writes are ``statestore/writepath/merge/``.
"""
