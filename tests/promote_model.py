"""The demo's ``model`` with a changed state: it also counts the panes it was given per query
(``panes``), beside the demo's state; promoted by tests/test_promote.py (the live code keeps the
count as it was promoted: it carries unknown state fields along)."""

from __future__ import annotations

from typing import Any

from deltawheel.demo.pipeline import Model


class TaggedModel(Model):
    """:class:`Model`, plus a count of the panes it processed per query (``panes``)."""

    def process_record(self, ctx: Any, record: Any) -> None:
        """As :meth:`Model.process_record`, then one more pane counted."""
        super().process_record(ctx, record)
        st = ctx.state
        if st is not None:
            ctx.state = {**st, "panes": int(st.get("panes", 0)) + 1}
