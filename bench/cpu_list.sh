#!/usr/bin/env bash
# N CPUs to pin a benchmark to, as a taskset list: one hardware thread of each physical core
# before the second thread of any core (CPUs 0 and 1 are siblings of one core on some machines,
# and two threads of one core share its FMA units), in the kernel's CPU order otherwise.
#
#   bench/cpu_list.sh N        prints e.g. 0,2,4,6
#   bench/cpu_list.sh --show   prints the machine's CPU, core and socket table (lscpu)
set -euo pipefail
if [[ ${1:-} == --show ]]; then
  lscpu -e=CPU,CORE,SOCKET,NODE 2>/dev/null || echo "lscpu: no topology"
  exit 0
fi
n=${1:?usage: bench/cpu_list.sh N}
if ! command -v lscpu >/dev/null; then
  seq -s, 0 $((n - 1))
  exit 0
fi
# lscpu -p: "cpu,core,socket" per line; a CPU's rank is how many CPUs of its core came before it.
lscpu -p=CPU,CORE,SOCKET | awk -F, -v n="$n" '
  /^#/ { next }
  { rank = seen[$3 "," $2]++; print rank, $1 }' |
  sort -k1,1n -k2,2n | head -n "$n" | awk '{ print $2 }' | sort -n | paste -sd, -
