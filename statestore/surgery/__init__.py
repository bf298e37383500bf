"""State surgery: a tool's fenced, audited change of a live computation's rows (``promote``, ``repair``):
:mod:`.replace` commits it, a repair statement becomes per-key :mod:`.edits`."""
