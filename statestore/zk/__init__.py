"""Coordination in ZooKeeper: the client, key-interval leases with sequencers, the store binding,
members, the low-watermark authority. It knows nothing of Delta: what needs ZooKeeper and the
rows table together (the interval owner, re-seeding) is in ``ownership/``.
"""
