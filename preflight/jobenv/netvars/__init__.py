"""Pure parsers for the network variables, written to agree with NCCL and torch, byte for byte.

Nothing here touches the system: each function takes strings (and plain data gathered by
:mod:`preflight.probes.net`) and returns plain data, so every rule is tested on literal strings.
Sources: NCCL docs, "Environment Variables", and the NCCL sources named in each module.

* :mod:`.iflist`: the list syntax of ``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_HCA``.
* :mod:`.sockets`: which interfaces NCCL's socket transport and bootstrap pick (the user's list
  or the auto-selection), ``NCCL_SOCKET_FAMILY``, ``GLOO_SOCKET_IFNAME``.
* :mod:`.ibhca`: which RDMA ports ``NCCL_IB_HCA`` selects.
* :mod:`.rendezvous`: ``MASTER_ADDR`` / ``MASTER_PORT``, ``NCCL_COMM_ID``, whether the job spans
  nodes.
* :mod:`.params`: NCCL's integer and on/off parameters.
"""

from __future__ import annotations

from preflight.jobenv.netvars.ibhca import IbSelection, select_ib
from preflight.jobenv.netvars.iflist import MAX_IFS, IfList, IfToken, parse_if_list
from preflight.jobenv.netvars.params import nccl_flag, nccl_int
from preflight.jobenv.netvars.rendezvous import (
    DEFAULT_MASTER_PORT,
    MasterAddr,
    ParseError,
    is_multi_node,
    parse_comm_id,
    parse_master_addr,
    parse_master_port,
)
from preflight.jobenv.netvars.sockets import (
    AUTO_STEPS,
    Selection,
    find_interfaces,
    in_subnet,
    nccl_socket_selection,
    parse_gloo_ifnames,
    socket_family,
    subnet_match,
)

__all__ = ["AUTO_STEPS", "DEFAULT_MASTER_PORT", "MAX_IFS", "IbSelection", "IfList", "IfToken",
           "MasterAddr", "ParseError", "Selection", "find_interfaces", "in_subnet",
           "is_multi_node", "nccl_flag", "nccl_int", "nccl_socket_selection", "parse_comm_id",
           "parse_gloo_ifnames", "parse_if_list", "parse_master_addr", "parse_master_port",
           "select_ib", "socket_family", "subnet_match"]
