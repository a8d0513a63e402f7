"""``preflight cluster``: one verdict for all the nodes of a job (docs/cluster.md).

:mod:`options` (who this agent is, from options or the launcher), :mod:`store` (the rendezvous on
torch.distributed's TCPStore, the only module here that imports torch), :mod:`agent` (the phases:
arrival, node checks, parity, world all-reduce, localisation, verdict), :mod:`parity` and
:mod:`localise` (pure judgements).
"""
