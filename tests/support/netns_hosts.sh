#!/usr/bin/env bash
# Several hosts on one machine: N network namespaces joined by a bridge, the bandwidth out of
# each limited with tc, a command run against them, and everything removed afterwards (on
# success, failure, timeout, Ctrl-C or SIGTERM; hosts left by a run that was SIGKILLed are
# removed by the next run).
#
#   netns_hosts.sh [--hosts N] [--rate RATE] [--slots S] [--prefix NAME] [--timeout SECONDS] -- COMMAND...
#
# Hosts are named PREFIX0..PREFIX{N-1} (default prefix "host"), each a namespace with eth0 on
# the bridge at 10.213.X.(k+1)/24 (X picked free; this machine's side of the bridge is .254, so
# mpirun here reaches the OpenMPI daemons in the namespaces). RATE (tc units: 100mbit, 1gbit;
# default none) caps what each host sends with a token bucket (tbf), so two hosts exchange at
# most RATE each way. COMMAND runs here with:
#   NETNS_HOSTS          the host names, space-separated
#   NETNS_HOSTFILE       an OpenMPI hostfile of them, S slots each (default: this machine's cores)
#   NETNS_SUBNET         10.213.X.0/24
#   NETNS_MPIRUN_FLAGS   mpirun flags that launch through netns_rsh.sh and keep OpenMPI's TCP
#                        traffic (BTL and OOB) on the namespaces' interfaces
# and its exit status is this script's; 124 when it ran past --timeout (default 600 s). When the
# hosts cannot be made here (not root, no ip or tc, no CAP_NET_ADMIN, no tbf) it says why and
# exits 77, which the tests treat as "skipped".
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hosts=2 rate="" slots="" prefix=host limit=600
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "netns_hosts.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if (($# == 0)); then
  echo "netns_hosts.sh: no command to run (netns_hosts.sh [options] -- COMMAND...)" >&2
  exit 2
fi
[[ $hosts =~ ^[1-9][0-9]?$ ]] || { echo "netns_hosts.sh: --hosts must be 1..99, got '$hosts'" >&2; exit 2; }
[[ $prefix =~ ^[a-z][a-z0-9-]{0,30}$ ]] || { echo "netns_hosts.sh: --prefix must be a host name, got '$prefix'" >&2; exit 2; }
slots=${slots:-$(nproc)}

skip() {
  echo "netns_hosts.sh: SKIP: cannot make network-namespace hosts here: $*" >&2
  exit 77
}
((EUID == 0)) || skip "needs root (CAP_NET_ADMIN), running as uid $EUID"
command -v ip >/dev/null || skip "no 'ip' command (apt-get install iproute2)"
command -v tc >/dev/null || skip "no 'tc' command (apt-get install iproute2)"

# What each run made, so that a run killed before its cleanup is undone by the next one.
state_dir=/run/pipeline-netns-hosts
mkdir -p "$state_dir" 2>/dev/null || skip "cannot write $state_dir"

teardown() {  # state file: line 1 owner pid, line 2 bridge, then one namespace a line
  local file=$1 owner bridge ns pids
  { read -r owner; read -r bridge; mapfile -t namespaces; } <"$file"
  for ns in "${namespaces[@]}"; do
    # The daemons and ranks the run started in its own namespaces: ask, then insist.
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    if [[ -n ${pids// /} ]]; then
      kill -TERM $pids 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
        [[ -z ${pids// /} ]] && break
        sleep 0.2
      done
      [[ -n ${pids// /} ]] && kill -KILL $pids 2>/dev/null
    fi
    ip netns del "$ns" 2>/dev/null
  done
  [[ -n $bridge ]] && ip link del "$bridge" 2>/dev/null
  rm -f "$file"
}
for f in "$state_dir"/*; do
  [[ -f $f ]] || continue
  owner=$(head -n1 "$f")
  if [[ -n $owner ]] && ! kill -0 "$owner" 2>/dev/null; then
    echo "netns_hosts.sh: removing hosts left by process $owner ($(tail -n +3 "$f" | tr '\n' ' '))" >&2
    teardown "$f"
  fi
done

names=()
for ((k = 0; k < hosts; ++k)); do names+=("$prefix$k"); done
for n in "${names[@]}"; do
  if ip netns list | awk '{print $1}' | grep -qxF "$n"; then
    echo "netns_hosts.sh: a network namespace '$n' exists already (another run? give --prefix)" >&2
    exit 1
  fi
done

# A /24 under 10.213 that no interface here uses.
x=$(($$ % 250))
for _ in $(seq 250); do
  ip -4 -o addr show | grep -q " 10\.213\.$x\." || break
  x=$(((x + 1) % 250))
done
subnet=10.213.$x.0/24
bridge=plbr$$
work=$(mktemp -d /tmp/netns-hosts.XXXXXX)
state=$state_dir/$$
printf '%s\n%s\n' $$ "$bridge" >"$state"

child=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null && wait "$child" 2>/dev/null
  teardown "$state"
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -n $rate ]]; then
  rate_bytes=$(awk -v r="$rate" 'BEGIN {
    if (!match(tolower(r), /^[0-9.]+(e[0-9]+)?/)) exit 1
    n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
    m["bit"] = 1/8; m["kbit"] = 1e3/8; m["mbit"] = 1e6/8; m["gbit"] = 1e9/8
    m["bps"] = 1; m["kbps"] = 1e3; m["mbps"] = 1e6; m["gbps"] = 1e9
    if (!(u in m) || n <= 0) exit 1
    printf "%d\n", n * m[u] }') || { echo "netns_hosts.sh: --rate '$rate': give tc units, e.g. 100mbit, 1gbit" >&2; exit 2; }
  # A quarter millisecond of the rate, at least 4 KiB (three packets): a port of that rate never
  # sends faster. (A 10 ms bucket let a pipeline's 32 KiB message leave an idle host at once,
  # 0.22 ms instead of 2.6 at 100 Mbit/s, so runs with round trips beat any real link of the rate;
  # with this one a message after a gap takes 2.56 ms and a stream still moves 12.2 MB/s.)
  burst=$((rate_bytes / 4000 > 4096 ? rate_bytes / 4000 : 4096))
fi

ip link add "$bridge" type bridge 2>"$work/err" || skip "ip link add type bridge: $(cat "$work/err")"
ip link set "$bridge" up
ip addr add "10.213.$x.254/24" dev "$bridge"
for ((k = 0; k < hosts; ++k)); do
  ns=${names[k]}
  ip netns add "$ns" 2>"$work/err" || skip "ip netns add: $(cat "$work/err")"
  echo "$ns" >>"$state"
  ip link add "plv$$x$k" type veth peer name eth0 netns "$ns" 2>"$work/err" || skip "veth: $(cat "$work/err")"
  ip link set "plv$$x$k" master "$bridge" up
  ip -n "$ns" addr add "10.213.$x.$((k + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [[ -n $rate ]]; then
    # tbf cuts segmentation-offloaded packets larger than the bucket into ones that fit.
    out=$(ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms 2>&1) ||
      skip "tc tbf rate $rate burst $burst: $out"
  fi
  echo "${names[k]} slots=$slots" >>"$work/hostfile"
done

export NETNS_HOSTS="${names[*]}" NETNS_HOSTFILE=$work/hostfile NETNS_SUBNET=$subnet
export NETNS_MPIRUN_FLAGS="--mca plm_rsh_agent $here/netns_rsh.sh --mca plm_rsh_no_tree_spawn 1 \
--mca btl tcp,vader,self --mca btl_tcp_if_include $subnet --mca oob_tcp_if_include $subnet"
echo "netns_hosts.sh: hosts ${names[*]} on $subnet${rate:+, each sending at most $rate}" >&2

timeout --kill-after=10 "$limit" "$@" &
child=$!
wait "$child"
status=$?
child=""
((status == 124)) && echo "netns_hosts.sh: '$*' ran past $limit s and was stopped" >&2
exit "$status"
