"""Kernel benchmarks behind `ddsim bench`: GDN and Mamba2 kernel times against their memory floors on CUDA,
trees per second per verify mode on the CPU.
"""
