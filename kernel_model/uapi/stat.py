"""Mirrors arch/x86/include/uapi/asm/stat.h (struct stat, what fstat(2) fills on
x86-64) and the dev_t encoding it carries (include/linux/kdev_t.h new_encode_dev,
which glibc's makedev/major/minor read back).
"""

from __future__ import annotations

from kernel_model.uapi.ustruct import UStruct, uapi_struct

# include/uapi/linux/stat.h
S_IFMT, S_IFREG, S_IFCHR = 0o170000, 0o100000, 0o020000


def S_ISCHR(mode: int) -> bool:
    return mode & S_IFMT == S_IFCHR


@uapi_struct
class stat(UStruct):
    """struct stat (x86-64): 144 bytes."""

    FIELDS = (("st_dev", "Q"), ("st_ino", "Q"), ("st_nlink", "Q"), ("st_mode", "I"),
              ("st_uid", "I"), ("st_gid", "I"), ("__pad0", "4x"), ("st_rdev", "Q"),
              ("st_size", "q"), ("st_blksize", "q"), ("st_blocks", "q"),
              ("st_atime", "Q"), ("st_atime_nsec", "Q"), ("st_mtime", "Q"),
              ("st_mtime_nsec", "Q"), ("st_ctime", "Q"), ("st_ctime_nsec", "Q"),
              ("__unused", "24x"))


def new_encode_dev(major: int, minor: int) -> int:
    """Mirrors new_encode_dev(): the dev_t as userspace sees it."""
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def makedev(major: int, minor: int) -> int:
    """glibc's makedev(): the same encoding, for the numbers userspace reads in sysfs."""
    return ((major & 0xFFF) << 8) | (minor & 0xFF) | ((minor & ~0xFF) << 12) \
        | ((major & ~0xFFF) << 32)
