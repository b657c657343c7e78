#!/usr/bin/env bash
# OpenMPI's rsh agent for hosts that are network namespaces on this machine (netns_hosts.sh):
# mpirun calls `netns_rsh.sh HOST orted ARGS...` as it would call ssh, and this runs the command
# inside the namespace HOST with HOST as its host name (its own UTS namespace), the command line
# joined and given to sh as ssh gives it to the remote shell.
#   mpirun --mca plm_rsh_agent tests/support/netns_rsh.sh --mca plm_rsh_no_tree_spawn 1 ...
set -euo pipefail
if (($# < 2)); then
  echo "usage: netns_rsh.sh HOST COMMAND [ARGS...]" >&2
  exit 2
fi
host=$1
shift
if ! ip netns list | awk '{print $1}' | grep -qxF -- "$host"; then
  echo "netns_rsh.sh: no network namespace '$host' on $(hostname) (make the hosts with tests/support/netns_hosts.sh)" >&2
  exit 255
fi
if unshare --uts true 2>/dev/null; then
  exec ip netns exec "$host" unshare --uts sh -c "hostname '$host' && $*"
fi
exec ip netns exec "$host" sh -c "$*"
