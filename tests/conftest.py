import os

import pytest
import torch

if not torch.cuda.is_available():
    # The GPU kernels run on CPU tensors in triton's interpreter (see stats/_triton.py); the
    # switch is read when a kernel is defined, so it is set before any test imports them.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    return


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
