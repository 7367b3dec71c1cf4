"""What the matrix runs on each target: the parts of the suite.

smoke: what .ci/run runs on both kernels for every submission. It covers
the paths that differ between KVMs and kernels (resolver vcpu and its bare
EFAULT, MINOR, WP, MOVE, readahead with vCPU resolvers, io_uring readers,
the default's SCHED_IDLE spinners beside pinned vCPUs,
the page server over loopback, the host facts, every dirty tracker, the
ring's CLI, preinstall, the source of a migration with every tracker in
every mode, each mode end to end, auto-converge's throttle, guest_memfd's
refusals and the guest's clock) in some 10 minutes a kernel,
two kernels side by side.
full: the whole suite, as the README runs it, less (on the emulated kernels
only) the tests that DESELECTED names: each holds this host's timing to a
bound that TCG, 5 to 20 times slower and with its own scheduling, cannot
keep. They are deselected, not skipped, and where-it-runs.md lists them.
"""
# The Debian kernels the matrix runs unless told otherwise, and .ci/run's:
# Debian 12's 6.1 and 6.12, the newest 6.18 backport and unstable's 7.2
# (uffdkvm.kernels.DEBIAN_KERNELS says what each name tracks).
KERNELS = ["6.1", "6.12", "6.18", "7.2"]

SMOKE = [
    "tests/fault_paths/test_resolver.py",
    "tests/fault_paths/test_move.py",
    "tests/fault_paths/test_wp.py",
    "tests/fault_paths/test_io_uring.py::test_every_read_is_a_completion_of_the_readers_ring",
    "tests/fault_paths/test_prefetch.py::test_readahead_cuts_sequential_faults_by_its_window",
    "tests/fault_paths/test_support.py",
    "tests/fault_paths/test_spin_idle.py",
    "tests/host/test_hostfacts.py",
    "tests/core/test_working_directory.py",
    "tests/core/test_dirty_tracking.py",
    "tests/cli/test_dirty_log.py::test_ring_entries_reach_the_ring",
    "tests/cli/test_dirty_log.py::test_the_tracker_is_the_one_asked_for",
    "tests/core/test_preinstall.py",
    "tests/migration/test_migrate.py::test_the_source_sends_what_the_tracker_found",
    "tests/migration/test_migrate.py::test_a_tracker_blind_to_a_page_fails_the_migration",
    "tests/migration/test_migrate.py::test_each_mode_verifies_and_the_destination_holds_what_was_sent",
    "tests/migration/test_migrate.py::test_postcopy_moves_each_page_exactly_once",
    # auto_converge's kicks: KVM_RUN's EINTR and immediate_exit, on each KVM
    "tests/migration/test_migrate.py::test_auto_converge_throttles_by_its_rule_and_vcpus_sleep",
    # guest_memfd: none on 6.1, only for other VM types on 6.12, mmap-able from
    # 6.18 and refused by userfaultfd there, each for the kernel's own reason
    "tests/core/test_backings.py::test_backing_runs_and_verifies[guest_memfd-missing]",
    "tests/core/test_backings.py::test_backing_runs_and_verifies[guest_memfd-None]",
    "tests/core/test_backings.py::test_guest_memfd_with_userfaultfd_is_refused_before_the_run_"
    "for_the_kernels_reason",
    "tests/core/test_backings.py::test_host_info_keeps_dev_kvm_and_vm_answers_apart",
    # the guest's clock: KVM's TSC offset, steady or (6.1 nested) moved by KVM
    "tests/measurements/test_timeline.py::test_every_fault_read_falls_inside_the_guests_own_stall",
    "tests/measurements/test_timeline.py::test_a_guest_clock_that_moves_during_the_run_gives_no_stages",
]

DESELECTED = {
    "tests/project/test_notebooks.py::test_runs_small":
        "each notebook must run in under 60 s at its small scale",
    "tests/core/test_effects_guest.py::test_guest_work_adds_guest_instructions_and_time_per_page":
        "guest work must cost more than 4 times a fault's time per page, as on a host "
        "that emulates every guest instruction",
    "tests/core/test_placement.py::test_pinned_threads_ran_only_where_they_were_pinned":
        "samples /proc for a fixed time and needs 20 samples of each thread",
    "tests/kernels/test_kernels.py":
        "boots kernels under QEMU, five times: inside an emulated guest each would be a "
        "guest of its KVM, itself emulated (minutes a boot)",
    "tests/pages/test_prefetch_remote.py::test_the_pusher_keeps_requests_in_flight":
        "the pipelined pusher must make every page resident within a quarter of the "
        "unpipelined floor (0.35 s of 1.28 s in the 6.1 guest)",
    "tests/pages/test_prefetch_remote.py::test_a_stop_mid_pipeline_leaves_promptly_and_leaves_"
    "nothing":
        "a stop must end within 3.5 s of the failure (4.0 s in the 6.12 guest)",
    "tests/project/test_sanitizers.py::test_c_program_under_sanitizer[asan-stall]":
        "a cancel with a stalled reader and vCPU must end within 3.5 s (3.5-4.1 s in both "
        "guests, under the sanitizers)",
    "tests/project/test_sanitizers.py::test_c_program_under_sanitizer[tsan-stall]":
        "as asan-stall",
    "tests/project/test_sanitizers.py::test_c_program_under_sanitizer[asan-timeout]":
        "one of two vCPUs must finish its 2 MiB within the no-progress window of 0.1 s "
        "(neither did, in both guests)",
    "tests/project/test_sanitizers.py::test_c_program_under_sanitizer[tsan-timeout]":
        "as asan-timeout",
    "tests/measurements/test_timeline.py::test_a_delay_lands_in_service_not_in_queue_or_resume":
        "a fault's queue stage must stay under 250 us at the median (301-304 us in both "
        "guests)",
    "tests/fault_paths/test_resolution.py::test_fixed_delay_is_the_same_for_every_fault":
        "the middle half of 1 ms delays must lie within 100 us of each other (118 us in "
        "the 6.12 guest)",
    "tests/pages/test_source_remote.py::test_max_inflight_1_makes_concurrent_faults_queue[0]":
        "with no cap on requests in flight none may wait 250 us for the server (0.9 ms and "
        "1.8 ms in the 6.1 and 6.12 guests)",
    "tests/project/test_matrix.py::test_a_part_stopped_at_its_bound_still_counts_what_ran":
        "pytest must start and pass a test within a 5 s bound (both guests were still "
        "importing)",
    "tests/testing/test_compare.py::test_the_example_suite_passes":
        "the example suite's MINOR handler budget is 200 us at p99 (285 us in the 6.12 "
        "guest)",
    "tests/testing/test_compare.py::test_overhead_metric_sees_the_delay":
        "a 50 us delay a fault must add 40 to 200 us of overhead a page (378 us in the 6.1 "
        "guest)",
}

PARTS = {
    "smoke": SMOKE,
    "full": [],       # no arguments: pytest's testpaths, the whole suite
}


def deselected_by(node: str) -> str | None:
    """Why DESELECTED leaves the test with this node id out, or None: a key
    covers the node ids it begins, as pytest's --deselect does."""
    for key, why in DESELECTED.items():
        if node == key or node.startswith((key + "::", key + "[")):
            return why
    return None


def pytest_args(part: str, emulated: bool) -> list[str]:
    """The arguments after `pytest` for a part, on an emulated kernel or not."""
    args = list(PARTS[part])
    if part == "full" and emulated:
        args += [f"--deselect={node}" for node in DESELECTED]
    return args
