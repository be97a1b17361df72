"""How the GPU kernels read a dtype and which histogram they count.

Shared by the launcher (``_triton.py``) and the kernels (``_triton_kernels.py``, as
constexpr); importing it does not import triton.
"""

# How each dtype's elements are read (one compiled kernel per kind).
FLOAT = 0  # float32 and float16: tl.load converts them exactly
FLOAT64 = 1
E4M3 = 2  # float8_e4m3fn, read as its bits (uint8)
E5M2 = 3  # float8_e5m2, read as its bits: float16's top byte
INTEGER = 4  # integers and booleans (as uint8): counts of zeros and signs only
BF16 = 5  # bfloat16, read as its bits (int16): float32's top half, subnormals kept

# Histograms.
NO_HISTOGRAM = 0
LOG2 = 1
LINEAR = 2
SIGNED_LOG2 = 3  # the log2 histogram split by sign: 512 slots
