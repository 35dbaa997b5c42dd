#!/usr/bin/env bash
# Make podman usable here and print the name of a base image for the Dockerfile's BASE argument.
#
#   bash .ci/podman.sh              # -> localhost/dispatcher-base:bookworm
#   bash .ci/podman.sh --no-base    # install only (a registry's base image will be used)
#
# Installs podman (with runc and catatonit for --init) and debootstrap from Debian's packages
# when they are missing, then, once, builds a minimal Debian 12 image with python3, its venv
# module and CA certificates from the apt mirror this machine already uses: no image registry is
# reachable here, so no public base can be pulled. Run by tests/e2e/test_container.py (and so by
# .ci/run); exit 3 when podman is missing and cannot be installed (not root, or no apt-get).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF="$here/containers.conf"
make_base=1
if [ "${1:-}" = --no-base ]; then make_base=0; shift; fi
tag=${1:-localhost/dispatcher-base:bookworm}

if ! command -v podman >/dev/null || ! command -v runc >/dev/null \
    || ! command -v debootstrap >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "podman is missing and cannot be installed here (needs root and apt-get)" >&2
    exit 3
  fi
  # Another apt (e.g. a parallel install) may hold the lock: wait for it rather than fail.
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
    podman runc catatonit debootstrap uidmap >/dev/null
fi

if [ "$make_base" = 1 ] && ! podman image exists "$tag"; then
  mirror=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
  fi
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "${mirror:-http://deb.debian.org/debian}" >/dev/null
  # The package lists and downloaded packages are of no use in an image: 90 MB less.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import -q --change 'CMD ["python3"]' - "$tag" >/dev/null
fi
if [ "$make_base" = 1 ]; then echo "$tag"; fi
