"""Ownership of key intervals over ZooKeeper and the rows table: lease, fence, recover; re-seeding."""
