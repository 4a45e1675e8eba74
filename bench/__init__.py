"""GPU time (CUPTI inside CUDA graphs) and host time (wall clock) of BF16 GEMM paths."""
