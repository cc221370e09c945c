"""A default POSIX ACL, for the tests of what new files inherit in a directory."""

from __future__ import annotations

import os
import struct

#: ``system.posix_acl_default``: version 2, then (tag, perm, id) entries: user::rwx, a
#: named user 1234 with rwx, group::r-x, the mask the named entry needs, other::r-x. New
#: files and directories made under it get ACLs (xattrs) of their own.
DEFAULT_ACL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, perm, ident)
    for tag, perm, ident in [
        (0x01, 7, 0xFFFFFFFF),
        (0x02, 7, 1234),
        (0x04, 5, 0xFFFFFFFF),
        (0x10, 7, 0xFFFFFFFF),
        (0x20, 5, 0xFFFFFFFF),
    ]
)


def inherits_acls(directory: str) -> bool:
    """Whether a file made in ``directory`` gets extended attributes (its default ACL's)."""
    probe = os.path.join(directory, ".acl-probe")
    with open(probe, "wb"):
        pass
    try:
        return bool(os.listxattr(probe))
    finally:
        os.unlink(probe)
