#!/usr/bin/env bash
# Start docker's daemon for arl's docker sandbox backend (arl.sandbox.oci) where no init system
# starts it (a container, a CI job): as root, in the background, with no network set up
# (--iptables=false --bridge=none: every arl container runs with --network none), logging to
# ${DOCKERD_LOG:-/var/log/dockerd-arl.log}. Returns once `docker info` answers (at most 60 s).
# Does nothing where a daemon already answers. Extra dockerd flags: DOCKERD_FLAGS (e.g.
# "--storage-driver vfs" where overlayfs cannot be mounted).
set -euo pipefail
if docker info >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "scripts/dockerd.sh: dockerd needs root" >&2
  exit 1
fi
command -v dockerd >/dev/null 2>&1 || { echo "scripts/dockerd.sh: dockerd is not installed (apt-get install docker.io)" >&2; exit 1; }
LOG=${DOCKERD_LOG:-/var/log/dockerd-arl.log}
# shellcheck disable=SC2086  # DOCKERD_FLAGS is a list of flags
setsid nohup dockerd --iptables=false --ip6tables=false --bridge=none ${DOCKERD_FLAGS:-} >"$LOG" 2>&1 < /dev/null &
for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  if ! kill -0 $! 2>/dev/null; then
    echo "scripts/dockerd.sh: dockerd exited; the end of $LOG:" >&2
    tail -5 "$LOG" >&2
    exit 1
  fi
  sleep 1
done
echo "scripts/dockerd.sh: dockerd did not answer within 60 s (see $LOG)" >&2
exit 1
