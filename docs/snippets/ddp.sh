torchrun --standalone --nproc_per_node=2 examples/distributed.py runs/distributed
