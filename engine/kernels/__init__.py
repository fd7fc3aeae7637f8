"""Triton kernels for the CUDA path (attention, norm, rope, activation, sampling).

Deliberately imports nothing: triton fails to launch without a GPU or TRITON_INTERPRET=1, so each
kernel module is imported lazily by the code that uses it, never by importing this package.
"""
