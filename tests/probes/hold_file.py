"""A process that holds a file the way jobs hold /dev/shm: ``python hold_file.py PATH HOW BYTES
READY`` writes BYTES to PATH and keeps it ``open`` (a descriptor), ``mmap`` (a mapping only, the
descriptor closed: NCCL's segments) or ``deleted`` (open, then unlinked: PyTorch's DataLoader),
touches READY, and sleeps until killed."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time


def main(path: str, how: str, size: int, ready: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"x" * size)
    if how == "mmap":
        # libc's mmap: Python's mmap object would keep a duplicate of the descriptor.
        libc = ctypes.CDLL(None)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        at = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        assert at not in (None, ctypes.c_void_p(-1).value)
        os.close(fd)
    elif how == "deleted":
        os.unlink(path)
    with open(ready, "w"):
        pass
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
