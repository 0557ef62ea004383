#!/bin/bash
# th-down.sh N   Stops host thN and removes its netns, overlay and files. Idempotent; the last host
# also removes the bridge, the nftables table and restores ip_forward.
set -uo pipefail
N=$1; B=${TH_BASE:?}; NS=th$N; H=$B/hosts/$NS
if [ -f "$H/pid" ]; then
  P=$(cat "$H/pid")
  if kill -0 "$P" 2>/dev/null; then
    kill -TERM "$P"   # nspawn: SIGTERM = orderly halt of the container
    for _ in $(seq 1 100); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$P" 2>/dev/null && { kill -KILL "$P"; sleep 0.5; }
  fi
  rm -f "$H/pid"
fi
# A killed nspawn leaves its container behind (the container's init is re-parented to PID 1 and
# keeps the namespace, and so the veth, alive): end whatever still runs in the host's namespace.
PIDS=$(ip netns pids "$NS" 2>/dev/null | tr '\n' ' ')
if [ -n "${PIDS// /}" ]; then
  kill -KILL $PIDS 2>/dev/null
  for _ in $(seq 1 50); do [ -z "$(ip netns pids "$NS" 2>/dev/null)" ] && break; sleep 0.1; done
fi
mountpoint -q "$H/root" 2>/dev/null && umount "$H/root"
ip netns del "$NS" 2>/dev/null   # deletes the veth pair too
rm -rf "$H"
(
  flock 9
  if ! ip netns list 2>/dev/null | grep -qE '^th[0-9]+( |$)' && ip link show thbr0 >/dev/null 2>&1; then
    ip link del thbr0
    nft delete table ip testhosts 2>/dev/null
    if [ -f "$B/ip_forward.orig" ]; then sysctl -qw net.ipv4.ip_forward="$(cat "$B/ip_forward.orig")"; rm -f "$B/ip_forward.orig"; fi
  fi
) 9>"$B/.bridge.lock"
true
