"""The host a run meets (internal; uffdkvm.HostInfo is the public name):
what it is and can do (facts.py: HostInfo, KVM's and userfaultfd's
features, /proc/meminfo), and the limits run() checks before it starts
(limits.py: cgroup memory and pids, RLIMIT_NPROC)."""
