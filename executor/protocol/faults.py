"""The protocol's fault points, where tests inject crashes."""

from __future__ import annotations

from enum import StrEnum

from ..exceptions import BatchFailedError

__all__ = ["FaultPoint", "BatchFailedError"]


class FaultPoint(StrEnum):
    """Places in the protocol where tests inject crashes."""

    AFTER_PREPARE = "after_prepare"  # after dedup input prep, before user code
    AFTER_USER_CODE = "after_user_code"
    BEFORE_COMMIT = "before_commit"
    AFTER_COMMIT = "after_commit"
    AFTER_DELIVERY = "after_delivery"  # delivered, checkpoints not cleared yet
    BEFORE_WATERMARK = "before_watermark"
    IN_WEAK_DELIVERY = "in_weak_delivery"  # inside the thread appending weak productions
