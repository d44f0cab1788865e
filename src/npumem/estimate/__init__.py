"""`npumem estimate`: a PyTorch script's GPU or NPU memory, predicted on a machine with neither.

run.estimate() runs the script in a child process (child.py) on fake device tensors, over a
stand-in CUDA device (stand_in_device.cpp, built by native.py), records what it allocates,
adds the kernels' own workspaces (kernel_rules.py) and the attention kernel the target picks
(attention.py), then replays the recording through the allocator model under each setting.
"""
