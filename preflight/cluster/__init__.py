"""``preflight cluster``: one verdict for all the nodes of a job (docs/cluster.md).

:mod:`options` (who this agent is, from options or the launcher), :mod:`store` (the rendezvous on
torch.distributed's TCPStore, the only module here that imports torch), :mod:`wire` (what the
agents say to each other, and the checks every value passes), :mod:`roll` (the arrivals and
answers logs, the roll call), :mod:`agent` (the phases), :mod:`facts` (a node's arrival and its
link), :mod:`nodework` and :mod:`groups` (what a node runs: its checks, its share of an
all-reduce; merging and judging a group), :mod:`parity` and :mod:`localise` (pure judgements),
:mod:`verdict` (the verdict, its JSON and its text).
"""
