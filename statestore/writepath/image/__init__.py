"""The image write path: whole interval files replaced in one Delta transaction per batch (:mod:`.path`)."""
