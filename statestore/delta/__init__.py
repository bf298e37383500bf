"""Delta Lake at the protocol level: the Spark session with Delta's jars and deltawheel's log
store, a Python reader of the Delta log, fenced transactions through Delta's own API,
the store damage check, and read-only SQL views.
"""
