#!/usr/bin/env bash
# Installs what dptrain needs from Debian packages (run as root).  Idempotent:
# packages already present are skipped quickly.
#   bash scripts/install-deps.sh          build + run + test dependencies
#   bash scripts/install-deps.sh --torch  also PyTorch 1.13 (benchmarks, fixtures) and what the
#                                         Python package's tests use
set -euo pipefail
pkgs=(build-essential clang libclang-rt-14-dev zlib1g-dev libcsv-dev libzip-dev libpng-dev libjpeg-dev
      libdnnl-dev libopenblas-dev dataset-fashion-mnist hyperfine openmpi-bin libopenmpi-dev
      iproute2 pkgconf fortunes fortunes-min)  # fortunes*: the default text corpus (docs/text.md)
# --torch also: the Python package's stage (tests/python: numpy, a venv, an offline pip install)
if [[ "${1:-}" == "--torch" ]]; then pkgs+=(python3-torch python3-numpy python3-venv python3-pip python3-setuptools python3-wheel
                                           python3-mpi4py python3-sklearn python3-pytest); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
