"""Steps 2-4 of the per-batch protocol as Spark jobs: the user-job interface, the image and
MERGE jobs and their task functions, the per-key runner of user code, the direct read of
input files, and Spark's Python worker daemon.
"""
