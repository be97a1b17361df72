import os

import pytest
import torch

if not torch.cuda.is_available():
    # The GPU kernels run on CPU tensors in triton's interpreter (see stats/_triton.py); the
    # switch is read when a kernel is defined, so it is set before any test imports them.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def s3():
    """An S3 server (moto's) on this machine for the module's tests; see object_store_server."""
    from tests.store.object_store_server import s3_server

    with s3_server() as server:
        yield server


@pytest.fixture
def bucket(s3):
    """A new, empty bucket of the module's S3 server."""
    return s3.new_bucket()


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    return


# The files that take longest, first: ``pytest -n 2 --dist loadfile`` hands files out in the
# order collected, and one of these started last would run alone while the other worker idles.
_LONGEST_FIRST = (
    "tests/test_doc_outputs.py",
    "tests/test_examples.py",
    "tests/test_wheel.py",
    "tests/test_gpu_launches.py",
    "tests/stats/test_native_build.py",
    "tests/test_docs.py",
    "tests/stats/test_triton_compiled.py",
    "tests/store/test_store_memory.py",
    "tests/ui/test_ui_pictures_browser.py",
    "tests/test_benchmarks.py",
    "tests/capture/test_video.py",
    "tests/ui/test_ui_browser.py",
    "tests/test_migrating_examples.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::")[0]
    return _LONGEST_FIRST.index(path) if path in _LONGEST_FIRST else len(_LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
