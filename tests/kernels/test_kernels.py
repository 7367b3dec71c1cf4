"""uffdkvm.kernels: experiments in another kernel, booted under QEMU.

The guests here boot Debian 12's 6.1 by its Debian name and its 6.12
brought as a bzImage with its module tree, as a kernel a user built would
be (both fetched once into the kernel cache); the command line compares 6.1
by name with 6.1 brought, a kernel with itself. Each run here must report
the guest's kernel and its stock KVM (kvm_amd under TCG), never this
host's, or it did not run there.
"""
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest
from helpers.archive import unreachable_archive
from helpers.bzimage import write_bzimage
from helpers.children import uffdkvm_command
from helpers.hostfacts import DEBIAN_ARCHIVE_UNREACHABLE, NO_STATIC_BUSYBOX, host_skip, missing_tool

import uffdkvm
from uffdkvm import kernels
from uffdkvm.cli._common import CliError
from uffdkvm.cli.kernel import PROG
from uffdkvm.kernels import _debian, _kernel, _qemu
from uffdkvm.testing import Comparison, _interleaved

# 256 faults: a run in a TCG guest is some 0.5 s, and the tests here are about
# where a run ran and how its call went, not its rate (beyond a 300 us delay a
# fault showing, on this host).
SMALL = uffdkvm.Config(vcpus=1, mem_per_vcpu="1M")
KERNEL = "6.1"
OTHER = "6.12"      # booted as a kernel brought: its bzImage and module tree


def _need_qemu():
    needs = (missing_tool("qemu-system-x86_64"), missing_tool("cpio"), NO_STATIC_BUSYBOX)
    if any(f.holds for f in needs):
        host_skip(needs, "booting a kernel needs QEMU, cpio and a static busybox")


def _fetched(name):
    _need_qemu()
    try:
        return kernels.fetch(name)
    except kernels.KernelUnavailableError as e:
        host_skip(DEBIAN_ARCHIVE_UNREACHABLE, str(e))


@pytest.fixture(scope="module")
def debian_kernel():
    return _fetched(KERNEL)


@pytest.fixture(scope="module")
def _guests():
    """The module's guests by kind, booted once each; the last tests power
    them off, and a test run on its own or out of order boots its own."""
    booted = {}
    yield booted
    for g in booted.values():
        g.shutdown(wait=False, cancel_futures=True)


def _live(booted, kind, kernel, **options):
    if kind not in booted or booted[kind].closed:
        booted[kind] = kernels.Guest(kernel, **options)
    return booted[kind]


@pytest.fixture
def guest(debian_kernel, _guests):
    return _live(_guests, "debian", KERNEL)


@pytest.fixture(scope="module")
def other_kernel():
    return _fetched(OTHER)


# The brought guest is sized unlike the defaults (2 CPUs, 4096 MiB, no huge
# pages), so that a test sees each of Guest's sizes reach the guest.
BROUGHT_SIZES = {"cpus": 1, "memory_mib": 2560, "hugepages": 6}


@pytest.fixture
def brought_guest(other_kernel, _guests):
    return _live(_guests, "brought", kernels.brought(other_kernel.image, other_kernel.modules),
                 **BROUGHT_SIZES)


# ---- without a boot ----

def _bzimage(tmp_path, version):
    return write_bzimage(tmp_path / "bzImage", version)


def test_a_bzimage_is_named_by_the_release_its_header_gives(tmp_path):
    image = _bzimage(tmp_path, b"6.19.0-rc1-mine (me@box) #3 SMP PREEMPT_DYNAMIC")
    k = kernels.brought(image)
    assert (k.name, k.release, k.modules) == ("6.19.0-rc1-mine", "6.19.0-rc1-mine", None)
    assert kernels.brought(image, name="patched").name == "patched"


def test_what_is_not_a_kernel_is_refused_saying_why(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"\0" * 4096)
    with pytest.raises(kernels.KernelUnavailableError, match="not an x86 bzImage"):
        kernels.brought(junk)
    with pytest.raises(uffdkvm.ConfigError, match="neither a Debian kernel") as e:
        kernels.resolve("5.99")
    assert e.value.field == "kernel"
    image = _bzimage(tmp_path, b"6.19.0 #1")
    with pytest.raises(uffdkvm.ConfigError, match="modules.dep") as e:
        kernels.brought(image, tmp_path)        # a module tree depmod never indexed
    assert e.value.field == "modules"
    with pytest.raises(uffdkvm.ConfigError, match="accel"):
        kernels.Guest(image, accel="hvf")
    with pytest.raises(uffdkvm.ConfigError, match="memory_mib"):
        kernels.Guest(image, memory_mib=0)
    with pytest.raises(uffdkvm.ConfigError, match="cannot hold the 1028 MiB") as e:
        kernels.Guest(image, memory_mib=1024, gigantic_pages=1, hugepages=2)
    assert e.value.field == "memory_mib"


def test_image_and_modules_in_one_word(tmp_path):
    image = _bzimage(tmp_path, b"6.19.0 #1")
    tree = tmp_path / "mods" / "lib" / "modules" / "6.19.0"
    tree.mkdir(parents=True)
    (tree / "modules.dep").write_text("")
    for spec in (f"{image}:{tmp_path / 'mods'}", f"{image}:{tree}"):
        k = kernels.resolve(spec)
        assert (k.image, k.modules) == (image, tmp_path / "mods"), spec


def test_kvm_is_used_only_where_the_hosts_kvm_nests():
    vendor, why = _qemu._nested_kvm()
    auto = kernels.choose_accel("auto")
    assert auto.name == ("kvm" if vendor else "tcg") and auto.why == why
    if vendor is None:
        with pytest.raises(uffdkvm.HostUnsupportedError, match="accel='kvm'"):
            kernels.choose_accel("kvm")
    assert kernels.choose_accel("tcg").emulated


def test_a_kernel_that_cannot_be_fetched_is_unavailable_and_says_why(tmp_path, monkeypatch):
    unreachable_archive(monkeypatch, tmp_path)    # apt's update fails
    with pytest.raises(kernels.KernelUnavailableError) as e:
        kernels.fetch("7.2")
    assert "Debian kernel 7.2 (the newest 7.2 in sid) is unavailable" in str(e.value)
    assert "127.0.0.1:9" in str(e.value)
    assert isinstance(e.value, uffdkvm.HostUnsupportedError)  # a skip, never a pass


def test_a_series_debian_has_dropped_is_unavailable_and_says_so(debian_kernel):
    apt = _debian._Apt("sid")
    apt.update()
    with pytest.raises(kernels.KernelUnavailableError, match="moved on") as e:
        _debian.image_package(apt, _debian.Track("sid", series="5.99"))
    assert "no 5.99 kernel" in str(e.value)


def test_each_debian_name_unpacks_to_a_kernel_and_its_modules(debian_kernel):
    k = debian_kernel
    assert k.release.startswith("6.1.") and _kernel.image_release(k.image) == k.release
    files, missing = _kernel.module_files(k, ["kvm_amd", "9p", "ext4"])
    assert not missing and any(f.name.replace("-", "_").startswith("kvm_amd.ko") for f in files)


def test_a_name_is_resolved_again_only_when_its_lists_are_newer(debian_kernel, monkeypatch):
    asked = []
    real = _debian._Apt.cache
    monkeypatch.setattr(_debian._Apt, "cache", lambda self, *a: asked.append(a) or real(self, *a))
    assert kernels.fetch(KERNEL) == debian_kernel and not asked   # the same lists: no apt-cache
    resolved = kernels.cache_dir() / "resolved" / f"{KERNEL}.json"
    os.utime(resolved, (0, 0))                                     # lists newer than the answer
    assert kernels.fetch(KERNEL) == debian_kernel and asked
    assert resolved.stat().st_mtime > 0


def test_interleaved_trials_run_each_side_with_its_own_runner(kvm):
    # B's runner makes every fault wait 300 us: if compare ran A's runner
    # for both, the two would be the same.
    slow = lambda c: uffdkvm.run(c.replace(delay_us=300))  # noqa: E731
    c = _interleaved(SMALL, SMALL, "pages_per_s", True, trials=6, warmup=0, seed=None,
                     run_b=slow)
    assert c.verdict(0.05) == "worse" and c.ratio < 0.5, c.table()


def test_a_verdict_is_what_the_interval_shows():
    def c(low, high, higher_is_better=True):
        return Comparison("pages_per_s", higher_is_better, (1.0,) * 6, (1.0,) * 6,
                          (low + high) / 2, low, high, 6, 0.95)
    assert c(0.80, 0.90).verdict(0.05) == "worse"
    assert c(0.80, 0.96).verdict(0.05) == "unclear"   # its top end is within the tolerance
    assert c(0.96, 1.04).verdict(0.05) == "same"      # all of it is
    assert c(1.10, 1.30).verdict(0.05) == "better"
    assert c(0.90, 1.10).verdict(0.0) == "unclear"
    assert c(1.10, 1.30, higher_is_better=False).verdict(0.05) == "worse"
    assert "at least 10.0%" in c(0.80, 0.90).verdict_line(0.05)
    assert "nor ruled out" in c(0.5, 1.6).verdict_line(0.05)
    with pytest.raises(uffdkvm.ConfigError, match="tolerance"):
        c(1, 1).verdict(1.5)


# ---- in a booted kernel ----

def test_a_run_in_a_guest_runs_in_its_kernel_on_its_kvm(guest):
    r = guest.run(uffdkvm.Config(vcpus=2, mem_per_vcpu="1M"))
    assert r.verified and r.faults == 2 * 256 and len(r.vcpus) == 2
    assert r.host.kernel_release == guest.kernel.release == guest.release
    assert r.host.kernel_release != os.uname().release
    # Stock KVM, nested: under TCG's -cpu max kvm_amd, with KVM the host's own.
    assert r.host.kvm_module == _qemu.guest_kvm_module(guest.accel)


def test_what_a_call_raises_in_the_guest_is_raised_here(guest):
    # 6.1 has no guest_memfd: the guest's kernel says so, not this host's.
    with pytest.raises(uffdkvm.HostUnsupportedError, match="KVM_CAP_GUEST_MEMFD"):
        guest.run(uffdkvm.Config(backing="guest_memfd", uffd_mode=None, mem_per_vcpu="1M"))
    with pytest.raises(FileNotFoundError):
        guest.submit(os.stat, "/no/such/file").result()
    assert guest.submit(os.uname).result().release == guest.release


def test_a_sweep_runs_in_the_guest_it_is_given_as_executor(guest):
    df = uffdkvm.sweep(SMALL, executor=guest, readers=[1, 2], progress=False)
    assert list(df["readers"]) == [1, 2] and df["verified"].all()
    assert set(df["host_kernel_release"]) == {guest.release}


def test_the_run_and_sweep_commands_run_in_the_guest(guest, capsys):
    from uffdkvm.cli import run as cli_run, sweep as cli_sweep

    def boot():
        return contextlib.nullcontext(guest)     # the module's guest, left running
    fields = vars(cli_run.build_parser().parse_args(["-b", "1M", "--list-backings"]))
    assert cli_run.run_fields(fields, boot) == 0
    listed = capsys.readouterr().out
    assert "move" in listed and "UFFDIO_MOVE" in listed   # 6.1 has no UFFDIO_MOVE (6.8+)
    fields = vars(cli_run.build_parser().parse_args(["-b", "1M", "--json"]))
    assert cli_run.run_fields(fields, boot) == 0
    r = uffdkvm.Result.from_json(capsys.readouterr().out)
    assert r.verified and r.host.kernel_release == guest.release
    options = vars(cli_sweep.build_parser().parse_args(["-b", "1M", "-r", "1,2", "--json"]))
    assert cli_sweep.sweep_fields(options, boot) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["host_kernel_release"] for row in rows] == [guest.release] * 2


def test_a_command_checks_its_flags_before_it_boots():
    from uffdkvm.cli import run as cli_run, sweep as cli_sweep

    def boot():
        pytest.fail("booted for a command whose flags are wrong")
    fields = vars(cli_run.build_parser().parse_args(["-b", "4M", "-v", "1", "-c", "0,1"]))
    with pytest.raises(CliError, match="main thread"):
        cli_run.run_fields(fields, boot)
    fields = vars(cli_run.build_parser().parse_args(["-b", "4M", "-r", "0"]))
    with pytest.raises(uffdkvm.ConfigError, match="readers"):
        cli_run.run_fields(fields, boot)
    options = vars(cli_sweep.build_parser().parse_args(["-b", "4M", "-r", "1,0"]))
    with pytest.raises(uffdkvm.ConfigError, match="readers"):
        cli_sweep.sweep_fields(options, boot)


def test_two_kernels_are_compared_each_side_in_its_own(guest, brought_guest, other_kernel):
    c = kernels.compare(guest, brought_guest, SMALL, trials=6)
    # Each side's runs say which kernel they ran in: A's 6.1, B's 6.12.
    assert (c.kernel_a, c.release_a) == (KERNEL, guest.release)
    assert (c.kernel_b, c.release_b) == (other_kernel.release, other_kernel.release)
    assert c.release_a != c.release_b
    assert c.ci_low <= c.ratio <= c.ci_high and len(c.a) == len(c.b) == 6
    assert f"b: {other_kernel.release} ({other_kernel.release})" in c.table()
    assert (c.accel == "tcg") == guest.accel.emulated
    if guest.accel.emulated:
        assert "only b / a means anything" in c.table()


def test_the_guests_sizes_reach_it(brought_guest):
    g = brought_guest
    assert g.submit(os.cpu_count).result() == BROUGHT_SIZES["cpus"]
    meminfo = dict(line.split(":", 1) for line in g.submit(
        pathlib.Path.read_text, pathlib.Path("/proc/meminfo")).result().splitlines())
    total_mib = int(meminfo["MemTotal"].split()[0]) / 1024
    # Less what the kernel keeps for itself, never more than was given.
    assert 0.8 * BROUGHT_SIZES["memory_mib"] < total_mib <= BROUGHT_SIZES["memory_mib"]
    assert int(meminfo["HugePages_Total"]) == BROUGHT_SIZES["hugepages"]
    assert int(meminfo["Hugepagesize"].split()[0]) == 2048


def test_cancelling_a_call_the_worker_has_not_taken_takes_it_back(guest):
    first = guest.submit(uffdkvm.run, uffdkvm.Config(mem_per_vcpu="8M", delay_us=500))
    second = guest.submit(uffdkvm.run, SMALL)
    assert second.cancel()
    assert first.result(timeout=300).verified
    assert second.cancelled() and not guest._pending
    assert not list((guest._dir / "replies").iterdir())   # the second never ran
    assert guest.run(SMALL).verified                      # and the guest goes on


@pytest.mark.slow  # two guests booted under TCG, six trials each
def test_the_cli_compares_a_kernel_with_itself(debian_kernel):
    k = debian_kernel
    p = subprocess.run(uffdkvm_command("kernel", "compare", KERNEL, f"{k.image}:{k.modules}",
                                       "-b", "1M", "--trials", "6", "--tolerance", "0.1",
                                       "--fail-if", "worse", "--fail-if", "better", "--json"),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    # No difference found: neither worse nor better (with TCG's noise the
    # interval is wide, so it is rarely narrow enough to be "same").
    assert out["verdict"] in ("same", "unclear") and out["ci_low"] <= out["ratio"] <= \
        out["ci_high"]
    assert out["release_a"] == out["release_b"] == k.release
    assert len(out["a"]) == len(out["b"]) == 6 and out["tolerance"] == 0.1


@pytest.mark.slow  # a guest booted under TCG for the one signalled while running
@pytest.mark.parametrize("sig, status, said, when", [
    # Ctrl-C at a terminal (to the group), in the middle of a run in the guest
    (signal.SIGINT, 130, "interrupted", "running"),
    # kill, a CI job cancelled: SystemExit where SIGINT raises KeyboardInterrupt,
    # the same unwinding; here while the guest boots, where Guest() unwinds it
    (signal.SIGTERM, 143, "", "booting"),
    # no cleanup at all: QEMU dies with it (PR_SET_PDEATHSIG), whenever it comes
    (signal.SIGKILL, -signal.SIGKILL, "", "booting"),
])
def test_a_signal_ends_the_command_and_its_guest(debian_kernel, tmp_path, sig, status, said,
                                                 when):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.Popen(uffdkvm_command("kernel", "run", KERNEL, "-b", "64M", "-d", "1000"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        if when == "running":
            line = _line_within(p.stderr, 600)       # printed once the guest is up
            assert f"{PROG}: in {KERNEL} (" in line, line
            qemus = [q for q in _qemus() if _parent(q) == p.pid]
            time.sleep(2)                            # the run is under way in the guest
        else:
            qemus = _children_within(p.pid, 60)
            time.sleep(1)                            # QEMU is loading the kernel
        assert len(qemus) == 1, qemus
        os.killpg(p.pid, sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == status and said in err, err
    deadline = time.monotonic() + 15               # PDEATHSIG's SIGKILL, then reaping
    while set(qemus) & set(_qemus()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(qemus) & set(_qemus())
    left = list(_qemu.disk_dir().glob(f"tmpdir-{p.pid}-*.img"))
    if sig != signal.SIGKILL:
        assert not list(tmp_path.glob("uffdkvm-guest-*")) and not left
    else:
        # A SIGKILL leaves its disk, until the next guest's boot sweeps it away.
        assert len(left) == 1, left
        mine = _qemu._disk_file()
        mine.unlink()
        assert not left[0].exists()


def _line_within(stream, seconds):
    """stream's next line, or pytest.fail after `seconds`: a command that
    hangs before it prints must not hang the suite."""
    box = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    if not box:
        pytest.fail(f"nothing printed within {seconds} s")
    return box[0]


def _children_within(pid, seconds):
    """The QEMUs whose parent is pid, once there is one (pytest.fail after
    `seconds`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        qemus = [q for q in _qemus() if _parent(q) == pid]
        if qemus:
            return qemus
        time.sleep(0.05)
    pytest.fail(f"no QEMU started within {seconds} s")


def _qemus():
    return [p for p in os.listdir("/proc") if p.isdigit() and
            _cmdline(p).startswith(_qemu.QEMU)]


def _parent(pid):
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# These two power their guests off: they come last.

def test_a_call_over_its_bound_stops_the_guest(guest):
    guest.call_timeout_s = 2
    slow = guest.submit(uffdkvm.run, uffdkvm.Config(mem_per_vcpu="64M", delay_us=1000))
    with pytest.raises(uffdkvm.RunTimeoutError, match="call_timeout_s=2"):
        slow.result(timeout=120)
    assert guest.closed and not guest._machine.running()
    with pytest.raises(uffdkvm.RunTimeoutError):
        guest.submit(uffdkvm.run, SMALL)


def test_a_guest_that_dies_fails_its_calls_and_every_later_one_at_once(brought_guest):
    g = brought_guest
    directory, disk = g._dir, g._machine.disk
    slow = g.submit(uffdkvm.run, uffdkvm.Config(mem_per_vcpu="64M", delay_us=1000))
    queued = g.submit(uffdkvm.run, SMALL)
    # close() waits for the calls it has: the death must end that wait too.
    closing = threading.Thread(target=g.close, daemon=True)
    closing.start()
    time.sleep(2)
    g._machine.proc.kill()
    start = time.monotonic()
    for future in (slow, queued):
        with pytest.raises(uffdkvm.RunError, match="guest stopped"):
            future.result(timeout=60)
    assert time.monotonic() - start < 10
    closing.join(30)
    assert not closing.is_alive()
    with pytest.raises(uffdkvm.RunError, match="guest stopped"):
        g.run(SMALL)                       # never a wait for a reply that cannot come
    assert g.closed and not directory.exists() and not disk.exists()
    assert str(g._machine.proc.pid) not in _qemus()
