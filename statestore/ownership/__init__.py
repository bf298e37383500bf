"""Ownership of key intervals, over ZooKeeper and the rows table together: an interval owner
takes the leases, fences the intervals in the rows table, then runs the recovery scan
(:mod:`.owner`); re-seeding puts the store's sequencers back into a ZooKeeper that lost them
(:mod:`.reseed`).
"""
