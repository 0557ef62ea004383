#!/bin/bash
# th-stop.sh N   Halts host thN like a stopped VM: the container and its network go away, its disk
# (the overlay's upper layer) stays, so th-up.sh N boots it again with its files intact.
set -uo pipefail
N=$1; B=${TH_BASE:?}; NS=th$N; H=$B/hosts/$NS
if [ -f "$H/pid" ]; then
  P=$(cat "$H/pid")
  if kill -0 "$P" 2>/dev/null; then
    kill -TERM "$P"
    for _ in $(seq 1 150); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$P" 2>/dev/null && { kill -KILL "$P"; sleep 0.5; }
  fi
  rm -f "$H/pid" "$H/leader"
fi
# A killed nspawn leaves its container behind (the container's init is re-parented to PID 1 and
# keeps the namespace, and so the veth, alive): end whatever still runs in the host's namespace.
PIDS=$(ip netns pids "$NS" 2>/dev/null | tr '\n' ' ')
if [ -n "${PIDS// /}" ]; then
  kill -KILL $PIDS 2>/dev/null
  for _ in $(seq 1 50); do [ -z "$(ip netns pids "$NS" 2>/dev/null)" ] && break; sleep 0.1; done
fi
mountpoint -q "$H/root" 2>/dev/null && umount "$H/root"
ip netns del "$NS" 2>/dev/null
true
