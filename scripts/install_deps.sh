#!/usr/bin/env bash
# Installs what `make test` needs and is missing, from the distribution's packages.
# Run as root on Debian/Ubuntu it installs them; otherwise it names the packages.
# On a machine with everything present (e.g. the GPU machine, which has no network)
# it installs nothing and never touches the network.
set -euo pipefail

have_header() {  # have_header <relative header path>
  for root in /usr/include /usr/local/include /opt/include ${CPATH:+${CPATH//:/ }}; do
    [ -f "$root/$1" ] && return 0
  done
  return 1
}

missing=()
command -v cmake >/dev/null || missing+=(cmake)
have_header nlohmann/json.hpp || missing+=(nlohmann-json3-dev)
have_header catch2/catch.hpp || have_header catch2/catch_test_macros.hpp || missing+=(catch2)
command -v doxygen >/dev/null || missing+=(doxygen)
if ! python3 -c 'import venv, ensurepip' 2>/dev/null && ! python3 -c 'import numpy, ml_dtypes' 2>/dev/null; then
  missing+=(python3-venv)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
# Doxygen only matters for `make docs`: never go to the network (which may be absent,
# as on the offline GPU machine, where apt-get would hang on DNS) for it alone.
if [ "${missing[*]}" = doxygen ]; then
  echo "install_deps: doxygen missing: everything but 'make docs' works (apt-get install doxygen)" >&2
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "install_deps: installing ${missing[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  # Time-limited: an offline machine must fail fast, not hang.
  if timeout 300 apt-get update -qq && timeout 600 apt-get install -y -qq "${missing[@]}" >/dev/null; then
    exit 0
  fi
  echo "install_deps: apt-get could not install ${missing[*]} (offline?)" >&2
else
  echo "install_deps: missing ${missing[*]}; install with: sudo apt-get install ${missing[*]}" >&2
fi

# Doxygen only matters for `make docs`: warn, but let the build and tests go on.
hard=()
for package in "${missing[@]}"; do [ "$package" != doxygen ] && hard+=("$package"); done
if [ ${#hard[@]} -gt 0 ]; then
  echo "install_deps: cannot continue without: ${hard[*]}" >&2
  exit 1
fi
echo "install_deps: doxygen missing: everything but 'make docs' works" >&2
