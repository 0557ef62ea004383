#!/bin/bash
# th-up.sh N IMAGE_DIRS
# Boots host "thN" (systemd-nspawn, systemd as PID 1) in its own network namespace at ${TH_NET}.(10+N),
# on bridge thbr0 with NAT to the uplink. Idempotent: a host that is already up is left alone.
# IMAGE_DIRS is the golden image folder, or several layers joined by ':' with the top one first
# (overlayfs's lowerdir syntax), e.g. the Deep Learning VM layer over the golden image.
# TH_NFT_FILE (optional; the sandbox backend's GCE firewall) is loaded into the host's namespace with
# `nft -f` before the host has an address; port 22 is then not waited for (the rules may close it).
set -euo pipefail
N=$1; IMG=$2
TH_BASE=${TH_BASE:?}; TH_NET=${TH_NET:-10.213.0}; KEY=${TH_KEY:-$TH_BASE/ssh/id_ed25519}
NS=th$N; IP=$TH_NET.$((10+N)); H=$TH_BASE/hosts/$NS; R=$H/root
if [ -f "$H/pid" ] && kill -0 "$(cat "$H/pid")" 2>/dev/null; then echo "$NS $IP already up"; exit 0; fi
mkdir -p "$H"
# A stopped host boots again from the layers it was created with, as a VM keeps its boot disk.
if [ -s "$H/lowerdir" ]; then IMG=$(cat "$H/lowerdir"); else echo "$IMG" > "$H/lowerdir"; fi
IFS=: read -ra LAYERS <<< "$IMG"
for L in "${LAYERS[@]}"; do [ -d "$L/usr" ] || { echo "th-up.sh: image layer '$L' is missing: build it first" >&2; exit 2; }; done
[ -d "${LAYERS[-1]}/etc" ] || { echo "th-up.sh: golden image folder '${LAYERS[-1]}' has no etc/: build it first" >&2; exit 2; }
mkdir -p "$H/upper" "$H/work" "$R"; install -d -m 1777 "$H/tmp"   # /tmp on disk, as on a VM
install -d -m 1777 "$TH_BASE/pip-cache"
mountpoint -q "$R" || mount -t overlay overlay -o "lowerdir=$IMG,upperdir=$H/upper,workdir=$H/work" "$R"
(
  flock 9   # several hosts may start at once: one of them makes the bridge
  # The bridge's own MAC address is set, never inherited: a bridge takes the lowest MAC of its ports,
  # so a host joining (or leaving) with a lower one changed it under every other host, whose ARP
  # entries for the bridge's addresses (the gateway, the IAP stand-in's 35.235.240.1) then pointed
  # nowhere for up to a minute: an open ssh connection to another host hung ("Timeout waiting for
  # privilege escalation prompt") whenever a VM was created or deleted beside it.
  if ! ip link show thbr0 >/dev/null 2>&1; then
    ip link add thbr0 address 02:74:68:62:72:30 type bridge
    ip addr add "$TH_NET.1/24" dev thbr0; ip link set thbr0 up
    UP=$(ip route show default | awk '{print $5; exit}')
    [ -f "$TH_BASE/ip_forward.orig" ] || cat /proc/sys/net/ipv4/ip_forward > "$TH_BASE/ip_forward.orig"
    sysctl -qw net.ipv4.ip_forward=1
    nft -f - <<NFT
table ip testhosts {
  chain th_forward { type filter hook forward priority 0; policy accept;
    iifname "thbr0" oifname "$UP" ip saddr $TH_NET.0/24 accept
    iifname "$UP" oifname "thbr0" ct state established,related accept
    iifname "thbr0" oifname "thbr0" accept
    iifname "thbr0" drop
    oifname "thbr0" drop
  }
  chain th_postrouting { type nat hook postrouting priority 100;
    ip saddr $TH_NET.0/24 oifname "$UP" masquerade
  }
}
NFT
  fi
  # An address of Google's IAP range (35.235.240.0/20): the sandbox's IAP stand-in connects from it.
  ip addr replace 35.235.240.1/32 dev thbr0
  # The host's namespace joins the bridge under the same lock: a th-down.sh of the last other host
  # looks for namespaces under it before removing the bridge and the NAT this host needs.
  ip netns del "$NS" 2>/dev/null || true
  ip netns add "$NS"
  # A host removed moments ago may keep its veth while its last processes die (the kernel frees the
  # namespace, and with it the pair, only then): deleting this end removes both at once.
  ip link del "$NS-h" 2>/dev/null || true
  ip link add "$NS-h" type veth peer name eth0 netns "$NS"
  ip link set "$NS-h" master thbr0 up
) 9>"$TH_BASE/.bridge.lock"
# The instance's firewall (TH_NFT_FILE, from forja_sandbox/firewall.py via the sandbox backend), loaded
# before the namespace has an address, so nothing reaches the host that the rules do not admit.
if [ -n "${TH_NFT_FILE:-}" ]; then ip netns exec "$NS" nft -f "$TH_NFT_FILE"; fi
ip -n "$NS" link set lo up
ip -n "$NS" addr add "$IP/24" dev eth0; ip -n "$NS" link set eth0 up
ip -n "$NS" route add default via "$TH_NET.1"
echo "$NS" > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$NS" > "$R/etc/hosts"
if [ -z "${TH_NO_BAKED_KEY:-}" ]; then   # the fixture's key; a sandbox VM gets its keys from metadata instead
  for d in root/.ssh home/ansible/.ssh; do install -d -m 700 "$R/$d"; install -m 600 "$KEY.pub" "$R/$d/authorized_keys"; done
  chroot "$R" chown -R ansible: /home/ansible/.ssh
fi
# TH_GUEST_AGENT (optional): the folder of the guest-agent stand-in (forja_sandbox/guest_agent), which
# makes users and authorized_keys from the metadata server at TH_METADATA_URL, as Google's agent does.
if [ -n "${TH_GUEST_AGENT:-}" ]; then
  install -D -m 755 "$TH_GUEST_AGENT/agent.py" "$R/usr/local/lib/forja-guest-agent/agent.py"
  install -m 644 "$TH_GUEST_AGENT/forja-guest-agent.service" "$R/etc/systemd/system/forja-guest-agent.service"
  printf 'FORJA_METADATA_URL=%s\n' "${TH_METADATA_URL:?TH_GUEST_AGENT needs TH_METADATA_URL}" > "$R/etc/default/forja-guest-agent"
  install -d "$R/etc/systemd/system/multi-user.target.wants"
  ln -sfn ../forja-guest-agent.service "$R/etc/systemd/system/multi-user.target.wants/forja-guest-agent.service"
fi
DNS=$(awk '/^nameserver/{print $2; exit}' /etc/resolv.conf)   # the host's resolver, reached through NAT
if [ -L "$R/etc/resolv.conf" ]; then   # Ubuntu: keep systemd-resolved, give it an upstream
  mkdir -p "$R/etc/systemd/resolved.conf.d"; printf '[Resolve]\nDNS=%s\n' "$DNS" > "$R/etc/systemd/resolved.conf.d/th.conf"
else
  printf 'nameserver %s\n' "$DNS" > "$R/etc/resolv.conf"
fi
# Fixture only (never in roles): this machine's egress CA and a shared pip download cache.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
  chroot "$R" update-ca-certificates >/dev/null 2>&1
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\ncache-dir = /var/cache/forja-pip\n' > "$R/etc/pip.conf"
else
  printf '[global]\ncache-dir = /var/cache/forja-pip\n' > "$R/etc/pip.conf"
fi
install -d -m 1777 "$R/var/cache/forja-pip"
setsid systemd-nspawn -D "$R" -M "$NS" --register=no --keep-unit \
   --network-namespace-path="/run/netns/$NS" --resolv-conf=off --bind="$H/tmp:/tmp" \
   --bind="$TH_BASE/pip-cache:/var/cache/forja-pip" -b --console=passive \
   > "$H/console.log" 2>&1 < /dev/null &
echo $! > "$H/pid"
# The leader is the container's PID 1: the child of nspawn that is pid 1 in its own namespace. Right
# after the start nspawn briefly has a second child (its outer helper), so "a child" is not enough.
C=
for _ in $(seq 1 100); do
  for c in $(pgrep -P "$(cat "$H/pid")" || true); do
    [[ "$(grep '^NSpid:' "/proc/$c/status" 2>/dev/null)" =~ [[:space:]]1$ ]] && { C=$c; break 2; }
  done
  sleep 0.1
done
[ -n "$C" ] || { echo "th-up.sh: $NS did not start, see $H/console.log" >&2; exit 1; }
echo "$C" > "$H/leader"
for _ in $(seq 1 100); do   # the bus may not exist yet right after PID 1 starts
  st=$(timeout 60 nsenter -t "$C" -m -u -i -n -p systemctl is-system-running --wait 2>/dev/null || true)
  case $st in running|degraded) break;; esac; sleep 0.1
done
ip neigh flush to "$IP" 2>/dev/null || true   # a host that went down by itself leaves a stale ARP entry
# With a firewall, port 22 may rightly be closed to this machine: systemd's "running" is enough.
[ -n "${TH_NFT_FILE:-}" ] || timeout 30 bash -c "until echo > /dev/tcp/$IP/22; do sleep 0.1; done" 2>/dev/null
echo "$NS $IP up"
