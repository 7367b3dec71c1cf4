"""How a fault is waited for and resolved (docs/fault-paths.md).

fault_path_support() itself, the readers' wait modes (poll, epoll, read, spin,
spin_idle, io_uring) and read batches, the resolvers (readers, or resolver="vcpu"),
the ways of resolving (copy, zeropage, move, wp) and what a copy is taken from,
and prefetch (readahead, the background pusher, replay).
"""
