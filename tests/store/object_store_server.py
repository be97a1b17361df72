"""An S3 server in this process (moto's), for the tests of runs on object storage.

Each test gets a bucket of its own; the credentials are dummies, given as storage options,
never taken from the environment.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

REGION = "us-east-1"


class S3Server:
    """A running moto server: its endpoint, the storage options for it, and its buckets."""

    def __init__(self, endpoint: str) -> None:
        import boto3

        self.endpoint = endpoint
        self.options: dict[str, Any] = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION},
        }
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=REGION,
        )

    def new_bucket(self) -> str:
        """A new, empty bucket's name."""
        name = f"runs-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every object's key in ``bucket``, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    def bucket_exists(self, bucket: str) -> bool:
        names = [entry["Name"] for entry in self.client.list_buckets()["Buckets"]]
        return bucket in names

    def pending_uploads(self, bucket: str) -> list[str]:
        """Keys of the multipart uploads begun and neither completed nor aborted."""
        uploads = self.client.list_multipart_uploads(Bucket=bucket).get("Uploads", ())
        return [upload["Key"] for upload in uploads]


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server on a free port of 127.0.0.1, stopped afterwards."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()
