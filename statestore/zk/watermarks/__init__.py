"""Low watermarks (MillWheel sections 3.3 and 5.4), held in ZooKeeper.

ZooKeeper SUSPENDED / LOST: while the connection is SUSPENDED every call *pauses* as commits do
(bounded by ``max_pause_s``; a server that lost its data is not waited for) and a call cut off
by a drop is repeated, re-reading before it writes (``pause.py``, ``rounds.py``);
:meth:`WatermarkAuthority.last_known` serves the last published low watermark seen, flagged
stale (``seen.py``). A LOST session loses nothing here (every znode is persistent), but a
publish under lease sequencers that was in flight or paused when it expired raises
:class:`LeaseLostError`: the writer must publish again with the sequencer of a new grant.

Terms (times are epoch milliseconds): the *oldest work* of a key interval is
the oldest of its unprocessed input, pending event-time timers, undelivered
productions and watermark holds; the executor owning the interval publishes it
with its lease sequencer (``None``: nothing pending). An *injector watermark*
is an estimate the source declares (e.g. min event time of unfinished input, or
max seen minus a bound); records behind it are late; a finished source
publishes :data:`END_OF_TIME`. The *low watermark* of ``A`` = min(oldest work of
every interval of ``A``, low watermarks of its upstream computations and
injectors), recursively. ``None`` means *not known yet* (an interval or input
never published, or an upstream not declared yet): fire no event-time timer.
:data:`END_OF_TIME` means all input is finished and nothing is pending.

Layout below the client's chroot, per pipeline ``p`` (intervals as ``{I:05d}``)::

    /pipelines/{p}/topology/{c}                      {"upstream": ["injector:x", "computation:y"], ...}
    /pipelines/{p}/watermarks/computations/{c}/{I}   oldest work + the publisher's sequencer
    /pipelines/{p}/watermarks/injectors/{i}          injector watermark (monotonic)
    /pipelines/{p}/watermarks/instances/{i}/{n}      instance n's estimate of injector i (monotonic)
                                                     + the intervals (and sequencers) n held
    /pipelines/{p}/watermarks/caught_up/{c}/{I}      the sequencer of the last owner of interval I
                                                     that caught up on its input (rescaling)
    /pipelines/{p}/watermarks/low/{c}                published low watermark (monotonic)

Every update is a compare-and-set on the znode version (concurrent writers
re-read and retry). A writer whose sequencer is older than the stored one, or
than the interval's current lease grant, gets :class:`StaleSequencerError`.

The modules: ``authority.py`` (:class:`WatermarkAuthority`, the one object callers hold),
``low.py`` (the low watermark computed from its inputs, pure), ``codec.py`` (the znodes, their
payloads and format version), ``topology.py`` (who feeds whom), ``reading.py`` (the stored values
and the computation over them), ``publish.py`` (oldest work under the lease fence, and step 7's
one round), ``instances.py`` (several job instances reading one injector), ``rounds.py`` (a
pipelined read round and one transaction), ``pause.py`` (waiting for ZooKeeper), ``seen.py``
(the last low watermark seen).
"""

from .authority import WatermarkAuthority
from .codec import WATERMARK_FORMAT_VERSION, read_injector_watermark
from .low import END_OF_TIME
from .seen import LastKnown
from .topology import Topology, parse_upstream

__all__ = ["END_OF_TIME", "WATERMARK_FORMAT_VERSION", "LastKnown", "Topology", "WatermarkAuthority", "parse_upstream",
           "read_injector_watermark"]
