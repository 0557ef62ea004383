#!/bin/bash
# build-dlvm.sh GOLDEN_DIR LAYER_DIR WHEELHOUSE PIP_WHEEL REQUIREMENT...
# Builds the "dlvm" overlay layer: what the Deep Learning VM image adds to plain Ubuntu 22.04 where
# forja depends on it, i.e. the image's own Python environment with PyTorch. The layer is the upper
# folder of an overlay over the golden image in which the image's Python (jammy's /usr/bin/python3,
# Python 3.10) ran `pip install` as root, as an image build does; hosts then boot with
# lowerdir=LAYER:GOLDEN. Offline: pip reads only the wheelhouse (pip itself runs from its wheel,
# since minbase jammy has no pip). Written to LAYER_DIR.part and renamed at the end, so a half-built
# layer is never used.
set -euo pipefail
G=$1; L=$2; W=$3; PIPWHL=$4; shift 4
[ -d "$G/etc" ] || { echo "build-dlvm.sh: golden image '$G' has no etc/" >&2; exit 2; }
[ -f "$W/$PIPWHL" ] || { echo "build-dlvm.sh: $PIPWHL is not in the wheelhouse $W" >&2; exit 2; }
P=$L.part; M=$L.mnt; K=$L.work
umount "$M/var/cache/forja-wheels" 2>/dev/null || true; umount "$M" 2>/dev/null || true
rm -rf "$P" "$M" "$K"; mkdir -p "$P" "$M" "$K"
cleanup() {
  umount "$M/var/cache/forja-wheels" 2>/dev/null || true
  umount "$M" 2>/dev/null || true
  rm -rf "$M" "$K"
}
trap cleanup EXIT
mount -t overlay overlay -o "lowerdir=$G,upperdir=$P,workdir=$K" "$M"
mkdir -p "$M/var/cache/forja-wheels"
mount --bind -o ro "$W" "$M/var/cache/forja-wheels"
chroot "$M" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  /usr/bin/python3 "/var/cache/forja-wheels/$PIPWHL/pip" install --no-index --find-links /var/cache/forja-wheels \
  --no-cache-dir --disable-pip-version-check --root-user-action=ignore --progress-bar off "$@"
umount "$M/var/cache/forja-wheels"
rmdir "$M/var/cache/forja-wheels"
rm -rf "$M/root/.cache"
umount "$M"
mv "$P" "$L"
