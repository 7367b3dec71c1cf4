"""``uffdkvm dirty-log``: dirty_log_perf_test's flags, each reaching the run
(a flag the command dropped turns a test here red), upstream's lines in its
words and order (uffdkvm.cli.dirty_log.LINES, the regexes the benchmark reads
too), the per-pass table, and the exit codes.

Upstream's own binary is held to the same regexes where it is built: set
UFFDKVM_DIRTY_LOG_PERF_TEST to its path (tools/testing/selftests/kvm/
dirty_log_perf_test; it needs /dev/kvm, as root here), or put it on PATH.
"""
import json
import os
import re
import shutil
import subprocess

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import python, uffdkvm_command
from helpers.hostfacts import NO_UFFD_WP_ASYNC, host_skip, missing_tool
from helpers.skips import needs_test_hooks

import uffdkvm
from uffdkvm.cli import dirty_log as cli_dirty
from uffdkvm.cli._common import EXIT_FAILED, EXIT_OK, EXIT_USAGE

UPSTREAM = os.environ.get("UFFDKVM_DIRTY_LOG_PERF_TEST") or shutil.which("dirty_log_perf_test")
PAGES_PER_MIB = 256


def dirty_log(*args):
    return subprocess.run(uffdkvm_command("dirty-log", *args), capture_output=True, text=True,
                          timeout=120, env=CHILD_ENV)


def skip_without(args):
    """--tracking wp_async needs UFFD_FEATURE_WP_ASYNC (Linux 6.7+): a skip
    citing the fact where this kernel lacks it (the CLI would exit 4)."""
    if "wp_async" in args and NO_UFFD_WP_ASYNC.holds:
        host_skip(NO_UFFD_WP_ASYNC, "--tracking wp_async")


def result_of(*args):
    """The run's Result (--json), after checking it exited 0."""
    p = dirty_log(*args, "--json")
    assert p.returncode == EXIT_OK, p.stderr
    return uffdkvm.Result.from_json(p.stdout)


def fields(*args):
    return cli_dirty.fields_of(cli_dirty.build_parser().parse_args(list(args)))


# ---- the parser: each flag into its field (no KVM) ----

@pytest.mark.parametrize("args,want", [
    ([], {"dirty_tracking": "bitmap_manual", "passes": 3, "uffd_mode": None,
          "mem_per_vcpu": "1G", "vcpus": 1, "write_percent": 100, "pattern": "sequential"}),
    (["-g"], {"dirty_tracking": "bitmap"}),
    (["--tracking", "ring"], {"dirty_tracking": "ring"}),
    (["--tracking", "WP_ASYNC"], {"dirty_tracking": "wp_async"}),
    (["-i", "5"], {"passes": 6}),
    (["-v", "3"], {"vcpus": 3}),
    (["-b", "16M"], {"mem_per_vcpu": "16M"}),
    (["-w", "30"], {"write_percent": 30}),
    (["--write-percent", "30"], {"write_percent": 30}),
    (["-a"], {"pattern": "random"}),
    (["-r", "7"], {"seed": 7}),
    (["--seed", "7"], {"seed": 7}),
    (["-s", "anonymous_hugetlb_2mb"], {"backing": "anonymous_hugetlb"}),
    (["-s", "shmem"], {"backing": "shmem"}),
    # upstream's -o: each vCPU walks all of vcpus x -b
    (["-o", "-v", "2", "-b", "4M"], {"overlap": True, "mem_per_vcpu": 8 << 20}),
    (["-c", "0,1", "-v", "2"], {"pin_vcpus": (0, 1), "pin_readers": None}),
    (["-c", "0,1,1", "-v", "2"], {"pin_vcpus": (0, 1), "pin_readers": "scheduler"}),
    (["-u", "MISSING"], {"uffd_mode": "missing"}),
    (["-u", "NONE"], {"uffd_mode": None}),
    (["--dirty-clear-pages", "128"], {"dirty_clear_pages": 128}),
    (["--dirty-ring-entries", "1024"], {"dirty_ring_entries": 1024}),
    (["--single-uffd"], {"single_uffd": True}),
    (["--readers", "3"], {"readers": 3}),
    (["-m", "9", "-x", "1"], {"dirty_tracking": "bitmap_manual"}),
])
def test_each_flag_sets_its_field(args, want):
    got, _ = fields(*args)
    assert {k: got[k] for k in want} == want


def test_the_fields_are_configs_fields():
    """What the parser hands on is Config's, every name (none left over from
    the upstream flags it refuses or turns into others)."""
    got, _ = fields("-g", "-i", "3", "-w", "50", "-a", "-r", "2", "-c", "0,0")
    assert set(got) <= {f for f in uffdkvm.Config.__dataclass_fields__}, \
        set(got) - set(uffdkvm.Config.__dataclass_fields__)
    assert uffdkvm.Config(**got).dirty_tracking == "bitmap"


def test_c_extra_entry_is_the_main_threads():
    assert fields("-c", "0,1,1", "-v", "2")[1] == 1
    assert fields("-c", "0,1", "-v", "2")[1] is None


@pytest.mark.parametrize("args,message", [
    (["-g", "--tracking", "ring"], "not allowed with argument -g"),
    (["-g", "--tracking", "bitmap"], "not allowed with argument -g"),
    (["-i", "1"], "at least 2 iterations"),
    (["-i", "x"], "not a number of iterations"),
    (["-x", "2"], "one memslot"),
    (["-p", "0x10000000"], "places the test memory itself"),
    (["-e"], "while dirty logging is disabled is not supported"),
    (["-n"], "nested (L2) vCPUs are not supported"),
    (["-m", "8"], "guest mode 8"),
    (["--tracking", "pml"], "invalid choice: 'pml'"),
    (["--passes", "3"], "give -i"),
    (["--wp-async"], "--tracking wp_async"),
    (["-c", "0,0,0", "-v", "1"], "-c: 3 CPUs for 1 vCPU"),
    (["-w", "101"], "write_percent"),
    (["-b", "12Q"], "mem_per_vcpu"),
    (["-o", "-b", "12Q"], "mem_per_vcpu"),
    (["--tracking", "ring", "--dirty-ring-entries", "1000"], "dirty_ring_entries"),
    (["--dirty-clear-pages", "100"], "dirty_clear_pages"),
])
def test_usage_errors_exit_2_and_say_why(args, message):
    p = dirty_log(*args)
    assert p.returncode == EXIT_USAGE, p.stderr
    assert message in p.stderr
    assert p.stdout == ""


def test_dispatched_from_uffdkvm_and_its_help_names_it():
    p = subprocess.run(uffdkvm_command("--help"), capture_output=True, text=True, timeout=60,
                       env=CHILD_ENV)
    assert "uffdkvm dirty-log --help" in p.stdout
    p = dirty_log("--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: uffdkvm dirty-log")


# ---- upstream's lines ----

def test_expected_kinds_are_upstreams_order():
    assert cli_dirty.expected_kinds(2, manual=True) == [
        "iterations", "mode", "populate", "enable", "dirty", "get", "clear", "dirty", "get",
        "clear", "disable", "get_total", "clear_total"]
    assert cli_dirty.expected_kinds(2, manual=False) == [
        "iterations", "mode", "populate", "enable", "dirty", "get", "dirty", "get",
        "disable", "get_total"]


# Upstream's output (6.12, -v 1 -b 64M -i 2, on the development host), for
# the regexes alone; the real binary is checked below when it is built.
UPSTREAM_SAMPLE = """\
Random seed: 0x6b8b4567
Test iterations: 2
Testing guest mode: PA-bits:ANY, VA-bits:48,  4K pages
Random seed: 0x1
guest physical test memory: [0xfffcfbffe000, 0xfffcffffe000)
Populate memory time: 0.629799307s
Enabling dirty logging time: 0.000114410s

Iteration 1 dirty memory time: 0.541234977s
Iteration 1 get dirty log time: 0.000006720s
Iteration 1 clear dirty log time: 0.000171897s
Iteration 2 dirty memory time: 0.539972495s
Iteration 2 get dirty log time: 0.000006780s
Iteration 2 clear dirty log time: 0.000195401s
Disabling dirty logging time: 0.000107961s
Get dirty log over 2 iterations took 0.000013500s. (Avg 0.000006750s/iteration)
Clear dirty log over 2 iterations took 0.000367298s. (Avg 0.000183649s/iteration)
"""


def test_the_regexes_read_upstreams_output():
    assert cli_dirty.line_kinds(UPSTREAM_SAMPLE) == cli_dirty.expected_kinds(2, manual=True)
    p = cli_dirty.parse(UPSTREAM_SAMPLE)
    assert p.iterations == 2
    assert p.populate_s == 0.629799307 and p.enable_s == 0.000114410
    assert p.dirty_s == [0.541234977, 0.539972495]
    assert p.get_s == [0.000006720, 0.000006780]
    assert p.clear_s == [0.000171897, 0.000195401]
    assert p.disable_s == 0.000107961
    assert p.get_total_s == 0.000013500 and p.clear_total_s == 0.000367298


def test_an_iteration_out_of_order_is_refused():
    with pytest.raises(ValueError, match="iteration 3 after 1"):
        cli_dirty.parse("Iteration 1 dirty memory time: 0.100000000s\n"
                        "Iteration 3 dirty memory time: 0.100000000s\n")


def ns(text):
    whole, frac = text.split(".")
    return int(whole) * 10**9 + int(frac)


def check_lines(out, iterations, manual):
    """out's upstream lines: their order, and the totals and averages as
    upstream computes them from the iterations (nanoseconds, integer
    division)."""
    assert cli_dirty.line_kinds(out) == cli_dirty.expected_kinds(iterations, manual), out
    lines = out.splitlines()
    upstreams = [x for x in lines if any(rx.fullmatch(x) for rx in cli_dirty.LINES.values())]
    assert upstreams[:2] == [f"Test iterations: {iterations}",
                             "Testing guest mode: PA-bits:ANY, VA-bits:48,  4K pages"]
    for kind in ("get", "clear") if manual else ("get",):
        each = [ns(m[2]) for m in map(cli_dirty.LINES[kind].fullmatch, lines) if m]
        total = next(m for m in map(cli_dirty.LINES[f"{kind}_total"].fullmatch, lines) if m)
        assert int(total[1]) == iterations
        assert ns(total[2]) == sum(each) and ns(total[3]) == sum(each) // iterations
    # the blank line upstream prints after enabling
    assert lines[lines.index(next(x for x in lines if x.startswith("Enabling"))) + 1] == ""


@pytest.mark.kvm
@pytest.mark.parametrize("args,manual", [([], True), (["-g"], False),
                                          (["--tracking", "ring"], False),
                                          (["--tracking", "wp_async"], False)])
def test_text_starts_with_upstreams_lines_in_its_order(kvm, args, manual):
    skip_without(args)
    p = dirty_log("-b", "4M", "-i", "3", *args)
    assert p.returncode == EXIT_OK, p.stderr
    check_lines(p.stdout, 3, manual)


@pytest.mark.kvm
def test_the_table_has_a_row_per_iteration_and_the_verified_line(kvm):
    p = dirty_log("-b", "4M", "-i", "3", "-v", "2")
    assert p.returncode == EXIT_OK, p.stderr
    lines = p.stdout.splitlines()
    assert re.search(r"^Memory verified:\t2048 pages hold what they must", p.stdout, re.M)
    i = lines.index("Tracked passes (bitmap_manual, cleared in one call per iteration):")
    assert lines[i + 1].split() == ["iteration", "dirty_s", "harvest_s", "reprotect_s",
                                    "found", "written", "excess", "ring_full_exits"]
    rows = [line.split() for line in lines[i + 2:i + 5]]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert all(r[5] == "2048" for r in rows)  # written: 2 vCPUs x 4 MiB, every page


def needs_upstream():
    if not UPSTREAM:
        host_skip(missing_tool("dirty_log_perf_test"), "upstream's binary: set "
                  "UFFDKVM_DIRTY_LOG_PERF_TEST to its path, or put it on PATH")
    return UPSTREAM


@pytest.mark.kvm
@pytest.mark.parametrize("args,manual", [([], True), (["-g"], False)])
def test_upstreams_binary_prints_what_the_regexes_read(kvm, args, manual):
    """The same flags to both: the same lines in the same order."""
    needs_upstream()
    theirs = subprocess.run([UPSTREAM, "-b", "4M", "-i", "3", *args], capture_output=True,
                            text=True, timeout=120)
    assert theirs.returncode == 0, theirs.stderr
    check_lines(theirs.stdout, 3, manual)
    ours = dirty_log("-b", "4M", "-i", "3", *args)
    assert cli_dirty.line_kinds(ours.stdout) == cli_dirty.line_kinds(theirs.stdout)


# ---- each flag reaches the run: the run's own record says so ----

@pytest.mark.kvm
def test_w_0_writes_nothing_in_any_pass(kvm):
    r = result_of("-b", "4M", "-w", "0")
    assert [p.written_pages for p in r.dirty_passes] == [0, 0]
    assert r.dirty_passes[-1].found_pages == 0  # nothing written: nothing dirty


@pytest.mark.kvm
def test_w_sets_the_share_written_and_each_pass_draws_its_own(kvm):
    """-w 50 writes about half the pages, a set of each pass's own as
    upstream's draws are (write_set per_pass: seeded, so the counts are
    exact for seed 0); --write-set fixed writes the same pages every pass."""
    r = result_of("-b", "4M", "-w", "50", "-i", "3")
    assert r.config.write_set == "per_pass"
    written = [p.written_pages for p in r.dirty_passes]
    assert all(0.4 * 1024 < w < 0.6 * 1024 for w in written)
    assert len(set(written)) > 1, written
    # bitmap_manual's first harvest: INITIALLY_SET reports every page
    assert r.dirty_passes[0].found_pages == 1024
    assert r.dirty_passes[0].excess_pages == 1024 - written[0]
    fixed = result_of("-b", "4M", "-w", "50", "-i", "3", "--write-set", "fixed")
    assert len({p.written_pages for p in fixed.dirty_passes}) == 1


@pytest.mark.kvm
def test_i_sets_the_iterations(kvm):
    r = result_of("-b", "1M", "-i", "4")
    assert [p.iteration for p in r.dirty_passes] == [1, 2, 3, 4]
    assert len(r.pass_seconds) == 5 and r.config.passes == 5


@pytest.mark.kvm
@pytest.mark.parametrize("args,tracking", [([], "bitmap_manual"), (["-g"], "bitmap"),
                                           (["--tracking", "ring"], "ring"),
                                           (["--tracking", "wp_async"], "wp_async")])
def test_the_tracker_is_the_one_asked_for(kvm, args, tracking):
    skip_without(args)
    p = dirty_log("-b", "1M", "--json", *args)
    assert p.returncode == EXIT_OK, p.stderr
    assert json.loads(p.stdout)["config"]["dirty_tracking"] == tracking
    r = uffdkvm.Result.from_json(p.stdout)
    # -g's get and wp_async's scan re-protect in the same call: no re-protect time
    if tracking in ("bitmap", "wp_async"):
        assert all(x.reprotect_seconds == 0.0 for x in r.dirty_passes)
    else:
        assert all(x.reprotect_seconds > 0.0 for x in r.dirty_passes)


@pytest.mark.kvm
@pytest.mark.parametrize("vcpus", [1, 2])
def test_v_sets_the_vcpus_whose_pages_are_found(kvm, vcpus):
    r = result_of("-b", "2M", "-v", str(vcpus))
    assert len(r.vcpus) == vcpus
    want = vcpus * 2 * PAGES_PER_MIB
    assert all(p.found_pages == p.written_pages == want for p in r.dirty_passes[1:])


@pytest.mark.kvm
@pytest.mark.parametrize("size,pages", [("1M", 256), ("4M", 1024)])
def test_b_sets_the_pages_found(kvm, size, pages):
    r = result_of("-b", size)
    assert [p.found_pages for p in r.dirty_passes[1:]] == [pages]


@pytest.mark.kvm
def test_o_makes_every_vcpu_walk_all_the_memory(kvm):
    r = result_of("-o", "-v", "2", "-b", "1M")
    assert r.config.overlap and r.config.region_bytes == 2 << 20
    assert all(v.pages == 3 * 512 for v in r.vcpus)  # all 512 pages in each of 3 passes


@pytest.mark.kvm
def test_ring_entries_reach_the_ring(kvm):
    """Some 1024 pages written a pass: a ring of 512 entries fills and exits
    on any KVM (stock KVM logs an entry a page, kvm_pvm about two); one of
    8192 never does."""
    big = result_of("-b", "8M", "-w", "50", "--tracking", "ring", "--dirty-ring-entries",
                    "8192")
    assert big.config.dirty_ring_entries == 8192
    assert [p.ring_full_exits for p in big.dirty_passes] == [0, 0]
    small = result_of("-b", "8M", "-w", "50", "--tracking", "ring", "--dirty-ring-entries",
                      "512")
    assert small.config.dirty_ring_entries == 512
    assert all(p.ring_full_exits > 0 for p in small.dirty_passes), small.dirty_passes
    assert all(p.found_pages == p.written_pages > 512 for p in small.dirty_passes)


@pytest.mark.kvm
def test_clear_pages_reaches_the_config(kvm):
    r = result_of("-b", "1M", "--dirty-clear-pages", "64")
    assert r.config.dirty_clear_pages == 64
    assert [p.found_pages for p in r.dirty_passes[1:]] == [256]


@pytest.mark.kvm
def test_a_r_and_u_reach_the_config(kvm):
    r = result_of("-b", "1M", "-a", "-r", "5", "-u", "MISSING")
    assert (r.config.pattern, r.config.seed, r.config.uffd_mode) == ("random", 5, "missing")
    assert r.faults == 256  # populated through userfaultfd, once per page
    default = result_of("-b", "1M")
    assert default.config.uffd_mode is None and default.faults == 0


@pytest.mark.kvm
def test_populate_and_enable_times_are_the_results(kvm):
    p = dirty_log("-b", "1M", "--json")
    r = uffdkvm.Result.from_json(p.stdout)
    text = cli_dirty.format_text(r)
    got = cli_dirty.parse(text)
    assert got.populate_s == pytest.approx(r.pass_seconds[0], abs=1e-9)
    assert got.enable_s == pytest.approx(r.dirty_enable_seconds, abs=1e-9)
    assert got.disable_s == pytest.approx(r.dirty_disable_seconds, abs=1e-9)
    assert got.dirty_s == pytest.approx([x.dirty_seconds for x in r.dirty_passes], abs=1e-9)


# ---- exit codes ----

CHILD = """
import sys
import uffdkvm.cli as cli
import uffdkvm.cli.dirty_log as cli_dirty
from uffdkvm.testing._faults import run_with_fault
def run(config, progress=None):
    return run_with_fault(config, "corrupt_page", after=3)
cli_dirty.run = run
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.kvm
def test_1_when_memory_does_not_verify(kvm):
    needs_test_hooks("the child corrupts a page with uffdkvm.testing._faults")
    p = subprocess.run(python("dirty-log", "-b", "1M", code=CHILD), capture_output=True,
                       text=True, timeout=120, env=CHILD_ENV)
    assert p.returncode == EXIT_FAILED, p.stderr
    assert "MEMORY VERIFICATION FAILED:\t1 bad pages" in p.stdout
