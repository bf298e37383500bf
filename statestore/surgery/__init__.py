"""State surgery: a tool's fenced, audited change of a live computation's rows (``promote``, ``repair``).

:mod:`.replace` takes the leases, commits one fenced write and records it (:mod:`.audit`); a repair
statement (:mod:`.repair`, :mod:`.merge`, :mod:`.sideviews`) becomes per-key :mod:`.edits`."""
