"""Low watermarks (MillWheel sections 3.3 and 5.4), held in ZooKeeper: :mod:`.authority`."""

from .authority import (
    END_OF_TIME,
    WATERMARK_FORMAT_VERSION,
    LastKnown,
    Topology,
    WatermarkAuthority,
    parse_upstream,
    read_injector_watermark,
)

__all__ = ["END_OF_TIME", "WATERMARK_FORMAT_VERSION", "LastKnown", "Topology", "WatermarkAuthority", "parse_upstream",
           "read_injector_watermark"]
