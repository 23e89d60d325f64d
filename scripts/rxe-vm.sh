#!/bin/bash
# Boot a throw-away Linux VM (qemu, software emulation) whose kernel has
# Soft-RoCE (rdma_rxe), bring up one RDMA device `rxe0`, and run a command
# inside it. The VM sees this machine's root filesystem read-only over 9p,
# so binaries built here run there unchanged. Nothing leaves the VM: it has
# no network card (-nic none); the RDMA device sits on a veth pair inside it.
#
#   scripts/rxe-vm.sh [--setup-only] [--timeout SECS] [--mtu BYTES] -- COMMAND [ARGS...]
#
# The command runs as root in the VM with cwd = the caller's cwd, with
# RXE_DEV=rxe0 and RXE_GID_INDEX=1 set. Its exit code is returned (124 when
# the VM did not finish it in time).
#
# What it takes, and why (each one is a boot that failed otherwise):
# - Debian packages qemu-system-x86 linux-image-amd64 busybox-static
#   rdma-core ibverbs-providers libibverbs1 iproute2 (and perftest for
#   ib_write_bw); installed here with apt-get when missing.
# - `-accel tcg`: KVM is often absent or broken on CI machines; software
#   emulation always works (slowly: compare ratios measured in the same VM
#   run, never absolute numbers).
# - A tiny busybox initramfs loads the virtio/9p modules, mounts the host
#   root read-only, binds /proc /sys /dev, mounts tmpfs on /tmp and /run,
#   and chroots. Inside the chroot the kernel cannot auto-load modules, so
#   they are loaded by hand: crc32_generic libcrc32c rdma_rxe ib_uverbs
#   rdma_ucm veth (without crc32_generic, `rdma link add` fails with ENOENT).
# - rxe needs an Ethernet netdev with an address: a veth pair in the VM.
# - ONE rxe device for every rank: queue pairs on the same device talk
#   through rxe's loopback; two rxe devices in one network namespace cannot
#   reach each other (their packets go through `lo` and are dropped).
# - GID index 1 is the IPv4-mapped RoCEv2 GID of the veth address.
# - /dev/shm is a fresh tmpfs (POSIX shared memory between the ranks);
# - /tmp inside the VM is a fresh tmpfs (programs there need it writable);
#   the directory under /tmp that holds the current directory or
#   $CARGO_TARGET_DIR (a checkout in /tmp/x) is bound into it read-only,
#   so that such a checkout runs too.
#
# Scratch shared with this machine, writable from the VM at the same path:
# $RXE_VM_OUT (default: a new directory under $RXE_VM_WORK, which defaults
# to /var/tmp/rxe-vm); the VM's console log is kept there.
set -euo pipefail
TIMEOUT=600; SETUP_ONLY=0
MTU=${RXE_VM_MTU:-9000}
MEM=${RXE_VM_MEM:-4096}
SMP=${RXE_VM_SMP:-$(nproc)}
while [ $# -gt 0 ]; do
  case "$1" in
    --setup-only) SETUP_ONLY=1; shift;;
    --timeout) TIMEOUT="$2"; shift 2;;
    --mtu) MTU="$2"; shift 2;;
    --) shift; break;;
    *) break;;
  esac
done
WORK=${RXE_VM_WORK:-/var/tmp/rxe-vm}
mkdir -p "$WORK"

need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
[ -x /bin/busybox ] || need_pkgs+=(busybox-static)
command -v rdma >/dev/null || need_pkgs+=(iproute2)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs.so.1 ] || need_pkgs+=(libibverbs1)
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so >/dev/null 2>&1 || need_pkgs+=(ibverbs-providers)
[ -e /etc/rdma ] || need_pkgs+=(rdma-core)
command -v ib_write_bw >/dev/null || need_pkgs+=(perftest)
ls /boot/vmlinuz-* >/dev/null 2>&1 || need_pkgs+=(linux-image-amd64)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "rxe-vm: installing ${need_pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
# The newest kernel that has both an image and its modules.
KVER=""
for k in $(ls /lib/modules | sort -V); do
  [ -e "/boot/vmlinuz-$k" ] && KVER=$k
done
[ -n "$KVER" ] || { echo "rxe-vm: no kernel image with modules in /boot" >&2; exit 2; }
KERNEL=/boot/vmlinuz-$KVER

# (v2: the init binds the host's /tmp entries named on the command line.)
INITRD=$WORK/initrd-$KVER-v2.gz
if [ ! -s "$INITRD" ]; then
  R=$(mktemp -d "$WORK/initrd-root.XXXXXX"); mkdir -p "$R"/{bin,mods,proc,sys,dev,newroot}
  cp /bin/busybox "$R/bin/busybox"
  : > "$R/modules.order"
  for m in virtio_pci 9pnet_virtio 9p; do modprobe -S "$KVER" --show-depends "$m"; done \
    | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' | while read -r p; do
        cp "$p" "$R/mods/"; basename "$p" >> "$R/modules.order"; done
  cat > "$R/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /mods/$m; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /newroot || poweroff -f
for d in proc sys dev; do mount --bind /$d /newroot/$d; done
mkdir -p /hosttmp; mount --bind /newroot/tmp /hosttmp
mount -t tmpfs tmpfs /newroot/tmp; mount -t tmpfs tmpfs /newroot/run
for d in $(sed -n 's/.*rxetmp=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' '); do
  mkdir -p "/newroot/tmp/$d" && mount --bind "/hosttmp/$d" "/newroot/tmp/$d"
done
OUTDIR=$(sed -n 's/.*rxeout=\([^ ]*\).*/\1/p' /proc/cmdline)
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 outdir /newroot$OUTDIR
chroot /newroot /bin/bash $OUTDIR/.vm-entry.sh
echo "RXE-VM-EXIT $?"
poweroff -f
INIT
  chmod +x "$R/init"
  (cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip > "$R.gz") && mv "$R.gz" "$INITRD"
  rm -rf "$R"
fi
[ "$SETUP_ONLY" = 1 ] && { echo "rxe-vm: ready ($KERNEL)"; exit 0; }
[ $# -gt 0 ] || { echo "usage: rxe-vm.sh [--timeout S] [--mtu B] -- COMMAND..." >&2; exit 2; }
# A scratch directory of its own unless told, so that VMs started at the
# same time (other users of this machine) never share one.
OUT=${RXE_VM_OUT:-$(mktemp -d "$WORK/out.XXXXXX")}
mkdir -p "$OUT"

# The entry script: load Soft-RoCE (modules by hand: the kernel's own
# module auto-loading cannot reach modprobe from inside the chroot),
# create rxe0 on a veth pair, then run the command.
{
  echo 'set -e'
  echo 'for m in crc32_generic libcrc32c rdma_rxe ib_uverbs rdma_ucm veth; do modprobe $m; done'
  echo 'ip link set lo up'
  echo 'ip link add veth0 type veth peer name veth1'
  printf 'ip link set veth0 mtu %q; ip link set veth1 mtu %q\n' "$MTU" "$MTU"
  echo 'ip addr add 192.0.2.1/24 dev veth0'   # TEST-NET-1, inside the VM only
  echo 'ip link set veth0 up; ip link set veth1 up'
  echo 'rdma link add rxe0 type rxe netdev veth0'
  # POSIX shared memory (shm_open) for ranks that also talk shared
  # memory: the VM's devtmpfs has no /dev/shm.
  echo 'mkdir -p /dev/shm; grep -q " /dev/shm " /proc/mounts || mount -t tmpfs -o mode=1777 tmpfs /dev/shm'
  echo 'export RXE_DEV=rxe0 RXE_GID_INDEX=1 HOME=/tmp'
  printf 'cd %q\n' "$PWD"
  echo 'set +e'
  printf '%q ' "$@"; echo
  echo 'rc=$?; echo "RXE-VM-CMD-RC $rc"; exit $rc'
} > "$OUT/.vm-entry.sh"

# Top-level entries of /tmp that the command needs from this machine.
TMP_KEEP=""
for p in "$PWD" "${CARGO_TARGET_DIR:-}"; do
  case "$p" in
    /tmp/?*) d=${p#/tmp/}; d=${d%%/*}; case ",$TMP_KEEP," in *",$d,"*) ;; *) TMP_KEEP=${TMP_KEEP:+$TMP_KEEP,}$d;; esac;;
  esac
done

LOG=$OUT/console.log
timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$MEM" -smp "$SMP" \
  -nographic -no-reboot -nic none -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 quiet rxeout=$OUT${TMP_KEEP:+ rxetmp=$TMP_KEEP}" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$OUT",mount_tag=outdir,security_model=none \
  > "$LOG" 2>&1 || true
sed -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' "$LOG" | grep -v -E '(SeaBIOS|iPXE|Press Ctrl-B|Booting from ROM|reboot: Power down)' \
  | grep -v 'RXE-VM-EXIT' | sed '/^\s*$/d'
rc=$(sed -n 's/.*RXE-VM-CMD-RC \([0-9]*\).*/\1/p' "$LOG" | tail -1)
[ -n "$rc" ] || { echo "rxe-vm: the VM did not finish the command (timeout ${TIMEOUT}s?)" >&2; exit 124; }
exit "$rc"
