"""Grouped speculative decoding: the drafter (`drafter`), its n-gram index (`match_index`) and
how far to draft (`budget`).

Nothing is imported here: vLLM's plugin loads `budget` before the worker scans loaded modules
for Triton kernels, and that scan trips over numba's objects, which `match_index` brings in.
"""
