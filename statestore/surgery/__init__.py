"""State surgery: a tool's fenced change of a live computation's rows (``deltawheel promote``,
``deltawheel repair``). One piece (:mod:`.replace`): take the intervals' leases (the running owner
hands them over at a batch boundary, ``zk/handover.py``), commit one fenced replacing write of their
rows, give the leases back, and record the change in the store's audit table (:mod:`.audit`).
A repair statement (:mod:`.repair`) says what it does to each key (:mod:`.edits`): UPDATE/DELETE of
the state, MERGE from a table or file (:mod:`.merge`), timers and pending productions (:mod:`.sideviews`).
Above ``inspection/`` (a repair edits the decoded state view), below ``session/``.
"""
