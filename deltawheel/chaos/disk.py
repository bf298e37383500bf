"""The store's small disk for ``disk-full``: a tmpfs over the store's folder (root only), filled to
ENOSPC and freed; at the run's end its content is copied back to the folder."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["StoreDisk", "FILLER", "unmount_stale"]

FILLER = ".chaos-filler"  # at the store's root: no reader of the store lists names starting with a dot
_CHUNK = 1 << 20


class StoreDisk:
    """A tmpfs of ``size_mb`` over ``folder``; :meth:`mount` says why not where it cannot."""

    def __init__(self, folder: Path, size_mb: int) -> None:
        self.folder = folder
        self.size_mb = size_mb
        self.mounted = False

    def mount(self) -> str | None:
        """Mount it (``folder`` made if missing); None, or the reason it is not mounted."""
        if self.size_mb <= 0:
            return "no tmpfs asked for (--store-tmpfs-mb 0)"
        if os.geteuid() != 0:
            return "mounting a tmpfs needs root"
        self.folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "chaos-store",
                               str(self.folder)], capture_output=True, text=True)
        if proc.returncode != 0:
            return f"mount -t tmpfs failed ({(proc.stderr or proc.stdout).strip()[:200]})"
        self.mounted = True
        return None

    def free_bytes(self) -> int:
        """Bytes free on the folder's file system."""
        st = os.statvfs(self.folder)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Write the filler file until the disk is full (ENOSPC); returns its size in bytes."""
        written = 0
        buf = b"\0" * _CHUNK
        with open(self.folder / FILLER, "ab", buffering=0) as out:
            for size in (_CHUNK, 4096, 1):  # the last bytes too
                chunk = memoryview(buf)[:size]
                while True:
                    try:
                        n = out.write(chunk)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    written += n or 0
        return written

    def free(self) -> None:
        """Delete the filler file (a tmpfs gives its pages back at once)."""
        (self.folder / FILLER).unlink(missing_ok=True)

    def unmount(self) -> str | None:
        """Copy the content aside, unmount (lazily when busy), put the copy back; None or what went wrong."""
        if not self.mounted:
            return None
        self.free()
        aside = self.folder.with_name(self.folder.name + ".saved")
        shutil.rmtree(aside, ignore_errors=True)
        shutil.copytree(self.folder, aside, symlinks=True)
        proc = subprocess.run(["umount", str(self.folder)], capture_output=True, text=True)
        note = None
        if proc.returncode != 0:
            note = f"umount: {(proc.stderr or proc.stdout).strip()[:200]}; detached lazily"
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True, text=True)
        self.mounted = False
        self.folder.rmdir()
        aside.rename(self.folder)
        return note


def unmount_stale(folder: Path) -> None:
    """Unmount a tmpfs an earlier run left over ``folder`` (a run killed before its end)."""
    if os.path.ismount(folder):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, text=True)
