"""Low watermarks (MillWheel sections 3.3 and 5.4), held in ZooKeeper.

ZooKeeper SUSPENDED / LOST: while the connection is SUSPENDED every call *pauses* as commits do
(bounded by ``max_pause_s``; a server that lost its data is not waited for) and a call cut off
by a drop is repeated, re-reading before it writes (``pause.py``, ``rounds.py``);
:meth:`WatermarkAuthority.last_known` serves the last published low watermark seen, flagged
stale (``seen.py``). A LOST session loses nothing here (every znode is persistent), but a
publish under lease sequencers that was in flight or paused when it expired raises
:class:`LeaseLostError`: the writer must publish again with the sequencer of a new grant.

Every update is a compare-and-set on the znode version (concurrent writers
re-read and retry). A writer whose sequencer is older than the stored one, or
than the interval's current lease grant, gets :class:`StaleSequencerError`.

Callers hold :class:`WatermarkAuthority` (``authority.py``); the rest: ``low.py``, ``codec.py``,
``topology.py``, ``reading.py``, ``publish.py``, ``instances.py``, ``rounds.py``, ``pause.py``,
``seen.py``. The terms (oldest work, injector watermark, low watermark, ``None``,
:data:`END_OF_TIME`) and the znode layout: docs/operations.md, "Watermarks in ZooKeeper".
"""

from .authority import WatermarkAuthority
from .codec import WATERMARK_FORMAT_VERSION, read_injector_watermark
from .low import END_OF_TIME
from .seen import LastKnown
from .topology import Topology, parse_upstream

__all__ = ["END_OF_TIME", "WATERMARK_FORMAT_VERSION", "LastKnown", "Topology", "WatermarkAuthority", "parse_upstream",
           "read_injector_watermark"]
