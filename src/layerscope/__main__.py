"""``python -m layerscope``: the ``layerscope`` command (see ``layerscope.cli``)."""

import sys

from layerscope.cli import main

if __name__ == "__main__":
    sys.exit(main())
