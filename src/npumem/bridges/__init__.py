"""Bridges to the frameworks people already run: PyTorch autograd (`CustomMatMul`), CuPy's
allocator hook (`cupy`). (PyTorch's own allocator state is read in profile/torch_allocator.py.) Each imports its framework
lazily, so `import npumem` never needs them. Tensors cross without copies through DLPack
(`npumem.from_dlpack`, `torch.from_dlpack`)."""
