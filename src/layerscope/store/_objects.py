"""Object stores (S3, Google Cloud Storage, Azure Blob): how a run's files are kept there.

An object store has no directories. A "folder" is a prefix of keys: it exists while an object
under it does, and nothing makes it beforehand (s3fs's ``makedirs`` would create a bucket, never
a folder). So nothing is made before a file is written, and a folder that holds no object lists
as not found: it is read as empty.

Nor can anything be renamed (a move is a copy and a delete), but an object appears whole once
its upload completes: a PUT, or the last request of a multipart upload. So a file is uploaded
under its final name, and an upload that fails is abandoned, never completed: a reader sees
all of the file or nothing of it, as a rename gives on a disk. A writer killed mid-upload
leaves an unfinished multipart upload, which no listing shows (a bucket's lifecycle rule
removes such uploads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

#: The fsspec protocols of object stores: s3fs, gcsfs, adlfs and ossfs.
OBJECT_PROTOCOLS = frozenset(("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "oss"))


def is_object_store(fs: Any) -> bool:
    """Whether ``fs`` is an object store: no directories, no rename.

    Examples:
        >>> import fsspec
        >>> is_object_store(fsspec.filesystem("memory")), is_object_store(fsspec.filesystem("file"))
        (False, False)
    """
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return any(protocol in OBJECT_PROTOCOLS for protocol in protocols)


def make_directory(fs: Any, path: str) -> None:
    """Make the directory ``path`` (and its parents) where ``fs`` has directories.

    On an object store nothing is made: the prefix exists once a file is written under it.
    """
    if not is_object_store(fs):
        fs.makedirs(path, exist_ok=True)


def upload_whole(fs: Any, path: str, write: Callable[[Any], object]) -> None:
    """Upload an object at ``path`` that appears only once ``write`` wrote all of it.

    Args:
        fs: an object store's filesystem.
        path: the object's key, its final name.
        write: writes the contents into the binary file object it is given.
    """
    file = fs.open(path, "wb", autocommit=True)
    try:
        write(file)
        # The PUT, or the multipart upload's last part and completion: the object appears now.
        # One that fails there leaves a begun upload, which fsspec's close does not abort.
        file.close()
    except BaseException:
        abandon(file)
        raise


def abandon(file: Any) -> None:
    """Give up an upload in progress: nothing of it appears, now or when ``file`` is collected."""
    with contextlib.suppress(Exception):  # the error that stopped the upload is the one to say
        file.discard()  # aborts a multipart upload begun
    with contextlib.suppress(Exception):
        file.closed = True  # fsspec completes an unclosed file's upload on close or collection
