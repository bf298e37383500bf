"""Coordination in ZooKeeper: client, leases, store binding, members, watermarks; nothing of Delta."""
