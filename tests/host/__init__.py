"""The host: what it lacks and what it limits. The suite's host facts and skip
audit (tests/helpers/hostfacts.py), hosts built without KVM or userfaultfd, and the
cgroup and rlimit limits run() checks (uffdkvm/host/).
"""
