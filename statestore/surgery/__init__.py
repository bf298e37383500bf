"""State surgery: a tool's fenced, audited change of a live computation's rows (``promote``, ``repair``)."""
