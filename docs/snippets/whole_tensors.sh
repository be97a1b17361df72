python examples/whole_tensors.py
