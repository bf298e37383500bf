"""Coordination in ZooKeeper: the client, the embedded server and a local ensemble, key-interval leases with
sequencers, the interval owner, the store binding, the low-watermark authority, re-seeding and the layout version.
"""
