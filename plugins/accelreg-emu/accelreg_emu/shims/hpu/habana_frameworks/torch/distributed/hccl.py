"""Stand-in for ``habana_frameworks.torch.distributed.hccl``.

The real module registers the ``hccl`` process-group backend; the emulator has no
collective backend of its own, so this only exists for the imports frameworks make.
"""
