#!/bin/bash
# build-golden.sh jammy|bookworm OUT_TARBALL
# Builds the golden root filesystem that every test/sandbox host boots from: a debootstrapped
# minbase with systemd, sshd, sudo and Python, brought to current updates like a cloud image,
# with an `ansible` sudo user. Needs: debootstrap systemd-container zstd curl. ~1.5 min.
set -euo pipefail
REL=$1; OUT=$2; B=${TH_BASE:?TH_BASE must name the work folder}; R=$B/build-$REL
PKGS=python3,python3-apt,openssh-server,sudo,systemd,systemd-sysv,dbus,iproute2,ca-certificates
rm -rf "$R"; mkdir -p "$(dirname "$OUT")"
case $REL in
  jammy)
    KR=$B/ukr/usr/share/keyrings/ubuntu-archive-keyring.gpg
    if [ ! -f "$KR" ]; then   # Debian 12 ships no Ubuntu keyring: take ubuntu-keyring from the Ubuntu archive itself
      M=$(awk '$1=="default_mirror" && $2 ~ /\/\/archive\./ {print $2; exit}' /usr/share/debootstrap/scripts/gutsy)
      mkdir -p "$B/ukr"
      curl -fsS --max-time 60 -o "$B/ukr/k.deb" "$M/pool/main/u/ubuntu-keyring/ubuntu-keyring_2021.03.26_all.deb"
      dpkg-deb -x "$B/ukr/k.deb" "$B/ukr"
    fi
    debootstrap --variant=minbase --components=main,universe --keyring="$KR" --include=$PKGS jammy "$R" > "$B/build-$REL.debootstrap.log"
    sed -i -E 's/^deb (\S+) jammy .*/deb \1 jammy main restricted universe multiverse\ndeb \1 jammy-updates main restricted universe multiverse\ndeb \1 jammy-security main restricted universe multiverse/' "$R/etc/apt/sources.list"
    ;;
  bookworm)
    debootstrap --variant=minbase --include=$PKGS bookworm "$R" > "$B/build-$REL.debootstrap.log"
    sed -i -E 's|^deb (\S+) bookworm .*|deb \1 bookworm main\ndeb \1 bookworm-updates main\ndeb \1-security bookworm-security main|' "$R/etc/apt/sources.list"
    ;;
  *) echo "build-golden.sh: unknown release '$REL' (use jammy or bookworm)" >&2; exit 2;;
esac
# bring to current updates like a cloud image; host network, resolver and CAs for this step only
RL=$(readlink "$R/etc/resolv.conf" || true)
cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/" 2>/dev/null || true
systemd-nspawn -q -D "$R" --register=no --keep-unit --resolv-conf=replace-host \
  --setenv=DEBIAN_FRONTEND=noninteractive sh -c \
  'apt-get -q update && apt-get -q -y -o Dpkg::Options::=--force-confold dist-upgrade && apt-get clean' > "$B/build-$REL.upgrade.log"
rm -f "$R"/usr/local/share/ca-certificates/*.crt; chroot "$R" update-ca-certificates --fresh >/dev/null
if [ -n "$RL" ]; then ln -sf "$RL" "$R/etc/resolv.conf"; fi   # replace-host turned the resolved symlink into a file
rm -rf "$R/var/lib/apt/lists/"*; mkdir -p "$R/var/lib/apt/lists/partial"
touch -d @0 "$R/var/lib/apt/lists"   # stale lists: apt's cache_valid_time then updates, as on a fresh VM
: > "$R/etc/machine-id"              # each boot gets its own id
chroot "$R" useradd -m -s /bin/bash -G sudo ansible
echo 'ansible ALL=(ALL) NOPASSWD:ALL' > "$R/etc/sudoers.d/90-ansible"; chmod 440 "$R/etc/sudoers.d/90-ansible"
tar -C "$R" --zstd -cf "$OUT.part" . && mv "$OUT.part" "$OUT"
rm -rf "$R"
