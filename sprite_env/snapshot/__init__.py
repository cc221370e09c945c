"""Files <-> store objects.

Today: a file's content as a list of chunk references (``filedata``). The capture of whole
trees, restore and diff build on it.
"""

from sprite_env.snapshot.filedata import ChunkRef, read_chunks, store_fd, store_file

__all__ = ["ChunkRef", "read_chunks", "store_fd", "store_file"]
