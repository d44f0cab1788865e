"""`npumem estimate`: a PyTorch script's GPU or NPU memory, predicted on a machine with neither.

run.estimate() starts child.py, which runs the script on fake device tensors over a stand-in
device (stand_in_device.cpp, built by native.py): operators.py handles each operator (shadows.py
keeps small tensors' real values, answers.py the rest, kernel_rules.py adds the kernels' own
workspaces), fake_run.py makes PyTorch take its GPU paths (attention.py: the attention kernel),
device_api.py serves torch.cuda. run.py then replays the recording through the allocator model
under each setting on the target's memory (targets.py); predicted.py writes it as a snapshot.
"""
