"""Low watermarks (MillWheel sections 3.3 and 5.4) in ZooKeeper, through :class:`WatermarkAuthority`.

Terms and znode layout: docs/operations.md, "Watermarks in ZooKeeper"."""

from .authority import WatermarkAuthority
from .codec import WATERMARK_FORMAT_VERSION, read_injector_watermark
from .low import END_OF_TIME
from .seen import LastKnown
from .topology import Topology, parse_upstream

__all__ = ["END_OF_TIME", "WATERMARK_FORMAT_VERSION", "LastKnown", "Topology", "WatermarkAuthority", "parse_upstream",
           "read_injector_watermark"]
