#!/bin/busybox sh
# The guest's /init (busybox, from the initramfs _initramfs.py builds): load
# the kernel's own modules, mount the host's / read-only over 9p with the
# job's directory writable at its own path, a disk-backed TMPDIR, and run the
# host's job in a chroot there. Its exit status, and everything it printed,
# land in the job's directory; then the guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

# Modules in dependency order (modules.order, one path a line); a module the
# kernel has built in is not in the list.
while read -r m; do
	insmod "/lib/modules/$m" 2>/dev/null || echo "uffdkvm-init: insmod $m failed"
done < /modules.order

out=$(cat /out.path)
mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /host ||
	{ echo "uffdkvm-init: cannot mount the host's root (does this kernel have 9p and virtio-pci?)"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "/host$out" ||
	{ echo "uffdkvm-init: cannot mount the job's directory"; poweroff -f; }
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -o bind /dev /host/dev
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm
mount -t devpts devpts /host/dev/pts
# The host's /tmp stays as it is (read-only: it may hold the checkout or the
# venv); the job's HOME is on a tmpfs under /run and its TMPDIR, /run/tmp, on
# the disk QEMU gives it (ext4, so a file's page cache can be dropped), or
# on the tmpfs where the kernel cannot mount that disk.
mount -t tmpfs -o mode=755 tmpfs /host/run
mkdir -p -m 1777 /host/run/tmp
mkdir -p /host/run/home
if [ -b /dev/vda ]; then
	mount -t ext4 /dev/vda /host/run/tmp && chmod 1777 /host/run/tmp ||
		echo "uffdkvm-init: cannot mount the TMPDIR disk: TMPDIR is on tmpfs"
else
	echo "uffdkvm-init: no TMPDIR disk (virtio-blk): TMPDIR is on tmpfs"
fi
[ -d /host/sys/fs/cgroup ] && mount -t cgroup2 cgroup2 /host/sys/fs/cgroup 2>/dev/null
ip link set lo up

echo "uffdkvm-init: running the job"
chroot /host /bin/sh "$out/job.sh" > "/host$out/job.log" 2>&1
echo $? > "/host$out/job.exit"
sync
echo "uffdkvm-init: job exited $(cat "/host$out/job.exit")"
umount /host/run/tmp 2>/dev/null
poweroff -f
