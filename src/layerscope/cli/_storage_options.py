"""``--storage-option KEY=VALUE``: the options of a run's filesystem, given on the command line.

A run on S3 needs credentials and an endpoint; ``layerscope.load`` takes them as
``storage_options``, and every command that reads runs takes them as ``--storage-option``
items, repeatable. VALUE is JSON where it parses (``anon=true``,
``client_kwargs={"endpoint_url": "http://127.0.0.1:9000"}``), else the text as it is
(``key=AKIA...``): options such as ``client_kwargs`` are dicts, which text alone cannot say.
fsspec adds the options of its own configuration (``FSSPEC_S3='{...}'``), as for ``load``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

#: The option's name, also before the command's name (see ``main``).
OPTION = "--storage-option"


def storage_option(text: str) -> tuple[str, Any]:
    """One ``KEY=VALUE`` item as ``(key, value)``, VALUE decoded as JSON where it is JSON.

    Examples:
        >>> storage_option("anon=true"), storage_option("key=AKIA1")
        (('anon', True), ('key', 'AKIA1'))
        >>> storage_option('client_kwargs={"region_name": "eu-west-1"}')
        ('client_kwargs', {'region_name': 'eu-west-1'})
    """
    key, equals, value = text.partition("=")
    if not equals or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE, KEY an option's name such as anon or client_kwargs and "
            f"VALUE JSON or text, got {text!r}"
        )
    try:
        return key, json.loads(value)
    except ValueError:  # not JSON: a key, a region, a profile's name
        return key, value


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--storage-option`` to a command's ``parser``."""
    parser.add_argument(
        OPTION,
        type=storage_option,
        action="append",
        dest="storage_options",
        metavar="KEY=VALUE",
        help="an option of the runs' filesystem, as layerscope.load(storage_options=...) "
        'takes it (repeatable; VALUE as JSON where it is: anon=true, client_kwargs={"endpoint_'
        'url": "http://..."})',
    )


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--storage-option`` items given, as ``storage_options``; the last of a key wins."""
    return dict(args.storage_options or ())
