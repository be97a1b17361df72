python examples/compiled.py
