"""Bridges to the frameworks people already run: PyTorch autograd (`CustomMatMul`), PyTorch's own
allocator state (`torch_allocator`), CuPy's allocator hook (`cupy`). Each imports its framework
lazily, so `import npumem` never needs them. Tensors cross without copies through DLPack
(`npumem.from_dlpack`, `torch.from_dlpack`)."""
