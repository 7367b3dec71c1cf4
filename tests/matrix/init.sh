#!/bin/busybox sh
# The matrix guest's /init (busybox, from an initramfs that initramfs.py
# builds): load the kernel's own modules, mount the host's / read-only over
# 9p with the job's output directory writable at its own path, and run the
# host's job in a chroot there (TMPDIR and HOME on a tmpfs under /run). Its
# exit status, and everything it printed, land in that directory; then the
# guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

# Modules in dependency order (modules.order, one path a line); a module the
# kernel has built in is not in the list.
while read -r m; do
	insmod "/lib/modules/$m" 2>/dev/null || echo "matrix-init: insmod $m failed"
done < /modules.order

out=$(cat /out.path)
mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /host ||
	{ echo "matrix-init: cannot mount the host's root"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "/host$out" ||
	{ echo "matrix-init: cannot mount the output directory"; poweroff -f; }
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -o bind /dev /host/dev
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm
mount -t devpts devpts /host/dev/pts
# The host's /tmp stays as it is (read-only: it may hold the checkout or the
# venv under test); the job's TMPDIR and HOME are on this tmpfs.
mount -t tmpfs -o mode=755 tmpfs /host/run
mkdir -p -m 1777 /host/run/tmp
mkdir -p /host/run/home
[ -d /host/sys/fs/cgroup ] && mount -t cgroup2 cgroup2 /host/sys/fs/cgroup 2>/dev/null
ip link set lo up

echo "matrix-init: running the job"
chroot /host /bin/sh "$out/job.sh" > "/host$out/job.log" 2>&1
echo $? > "/host$out/job.exit"
sync
echo "matrix-init: job exited $(cat /host$out/job.exit)"
poweroff -f
