"""The image write path: each task turns an interval's current file into a new one, the driver
commits all of them in one Delta transaction (local, ``file:`` and ``s3a://`` stores).
"""
