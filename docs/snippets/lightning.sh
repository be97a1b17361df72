python examples/lightning_callback.py
