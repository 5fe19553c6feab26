"""A temporary file read past the operating system's page cache (notebook 04).

The notebook times the reads; this module makes them reach the device. The page cache is the
memory in which the operating system keeps recently read file data: a read served from it
measures memory, not the disk. `open_uncached` opens a file with O_DIRECT, which sends reads
to the device (it needs page-aligned buffers: `aligned_buffer`), or, where the file system
refuses that, says how the cache will be emptied instead (`posix_fadvise(DONTNEED)`, which
`forget` applies before each pass).
"""
import mmap
import os
import tempfile
import weakref
from pathlib import Path

BLOCK = 4096


class ScratchFile:
    """A file of `size_mb` MiB of random bytes in the temporary directory, written through to
    the device (fsync) so that the page cache can drop it. Removed by close(), and in any case
    when the object is collected or the interpreter exits."""

    def __init__(self, size_mb, chunk=2**20):
        self._dir = tempfile.TemporaryDirectory()
        self._cleanup = weakref.finalize(self, self._dir.cleanup)
        self.path = Path(self._dir.name, 'storage-test.bin')
        self.size = size_mb * 2**20
        with open(self.path, 'wb') as f:
            for _ in range(self.size // chunk):
                f.write(os.urandom(chunk))
            f.flush()
            os.fsync(f.fileno())

    def close(self):
        self._cleanup()


def aligned_buffer(size):
    """A page-aligned buffer of `size` bytes (an anonymous mmap), as O_DIRECT requires."""
    return mmap.mmap(-1, size)


def read_at(fd, buffer, offset):
    """Read len(buffer) bytes at `offset` into `buffer`; the number of bytes read. os.preadv
    reads straight into the aligned buffer and releases Python's lock while it waits, so
    several threads can have reads in flight."""
    if hasattr(os, 'preadv'):
        return os.preadv(fd, [buffer], offset)
    data = os.pread(fd, len(buffer), offset)
    buffer[:len(data)] = data
    return len(data)


def filesystem_of(path):
    """The file-system type holding `path` (Linux), or None."""
    mounts = Path('/proc/mounts')
    if not mounts.exists():
        return None
    best, kind = '', None
    for line in mounts.read_text().splitlines():
        mount_point, fstype = line.split()[1:3]
        if str(path).startswith(mount_point) and len(mount_point) > len(best):
            best, kind = mount_point, fstype
    return kind


def describe(how, why):
    """How the reads reached the device, for the record: 'O_DIRECT', or the fallback and why."""
    return '; '.join(filter(None, (how, why)))


# ---- saved from 04_hardware.ipynb by make export: edit the notebook
def open_uncached(path):
    """(fd, how the page cache is bypassed or None, why not O_DIRECT or None)."""
    why = 'this system has no O_DIRECT'
    if hasattr(os, 'O_DIRECT'):
        fd = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            read_at(fd, aligned_buffer(BLOCK), 0)  # some file systems take the flag, refuse reads
            return fd, 'O_DIRECT', None
        except OSError as e:
            why = f'O_DIRECT refused ({e.strerror})'
            if fd is not None:
                os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    kind = filesystem_of(path)
    if kind in ('tmpfs', 'ramfs'):
        return fd, None, f'{why}, and the file lives in memory ({kind}): there is no disk here'
    if hasattr(os, 'posix_fadvise'):
        return fd, 'posix_fadvise(DONTNEED)', why
    return fd, None, f'{why}, and no posix_fadvise: the reads come from the page cache'


def forget(fd, how, pattern='POSIX_FADV_NORMAL'):
    """Empty the file's page cache where fadvise bypasses it, and announce `pattern`."""
    if how == 'posix_fadvise(DONTNEED)':
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, getattr(os, pattern))
# ---- end of what 04_hardware.ipynb saves
