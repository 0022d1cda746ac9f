"""The Lightning adapters: ``GRPOModule`` (Trainer), ``FabricLoop`` (Fabric), their shared update backend,
checkpoint IO, and the supervised warm start (``SFTModule``)."""

from lit_rlft.lightning.fabric import FabricLoop, fsdp2_parallelize
from lit_rlft.lightning.module import GRPOModule

__all__ = ["FabricLoop", "GRPOModule", "fsdp2_parallelize"]
