"""Object storage through Hadoop's ``s3a://``: the S3A jars and settings, a bucket client, typed errors."""
