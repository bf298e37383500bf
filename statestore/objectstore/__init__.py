"""Object storage (S3 through Hadoop's ``s3a://``): the S3A jars and Spark settings
(:mod:`.s3a`), a small S3 client for buckets (:mod:`.client`) and the typed errors of an
unreachable store, a missing bucket and wrong credentials (:mod:`.errors`).
"""
