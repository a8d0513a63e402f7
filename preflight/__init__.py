"""cluster-preflight: will torchrun + NCCL work on this node, and at full speed?"""

__version__ = "0.1.0"
