#!/usr/bin/env bash
# Installs what building and testing pipeline needs on Debian, when it is missing.
# Safe to run again: packages already present are not touched.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev libfmt-dev doctest-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libopenmpi-dev openmpi-bin
  # Several hosts on one machine (tests/support/netns_hosts.sh): ip netns, veth, bridge, tc.
  iproute2
  # The fuzz preset: clang, its libFuzzer and sanitizer runtimes, and LLVM's OpenMP (the library
  # uses OpenMP, and clang does not link GCC's libgomp).
  clang libclang-rt-14-dev libomp-14-dev
  dataset-fashion-mnist fortunes
  python3
  python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
