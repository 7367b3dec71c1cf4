"""Guest: a kernel booted under QEMU, running uffdkvm calls as an Executor.

The guest runs this host's Python, packages and files (its / is the host's,
read-only, over 9p) with the booted kernel and its KVM underneath, and a
worker (_worker.py) that takes calls through the guest's job directory.
A Guest is a concurrent.futures.Executor, so ``uffdkvm.sweep(executor=g)``
runs a sweep there; ``g.run(config)`` runs one experiment and returns its
Result as ``uffdkvm.run`` would have here, its ``host`` the guest's.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import pathlib
import pickle
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..config import Config
from ..errors import ConfigError, HostUnsupportedError, RunError, RunTimeoutError
from ..result import Result
from . import _debian, _kernel, _qemu, _worker

POLL_S = 0.02
# Guest's defaults, which uffdkvm kernel's flags take too.
MEMORY_MIB = 4096
CPUS = 2
CALL_TIMEOUT_S = 3600.0
BOOT_TIMEOUT_S = 300.0


def resolve(kernel: Any) -> _kernel.Kernel:
    """A Kernel for a Kernel, a Debian name ("6.18"), a bzImage's path, or
    "IMAGE:MODULES" (a bzImage and its module tree)."""
    if isinstance(kernel, _kernel.Kernel):
        return kernel
    if isinstance(kernel, str) and kernel in _debian.DEBIAN_KERNELS:
        return _debian.fetch(kernel)
    if isinstance(kernel, (str, os.PathLike)):
        image, modules = os.fspath(kernel), None
        if not os.path.exists(image) and ":" in image:
            image, modules = image.rsplit(":", 1)
        if not os.path.exists(image):
            raise ConfigError(f"kernel: {os.fspath(kernel)!r} is neither a Debian kernel "
                              f"({', '.join(_debian.DEBIAN_KERNELS)}) nor a file; give a "
                              f"bzImage's path, IMAGE:MODULES, or "
                              f"uffdkvm.kernels.brought(image, modules)", field="kernel")
        return _kernel.brought(image, modules)
    raise ConfigError(f"kernel: expected a Debian kernel's name, a bzImage's path or a "
                      f"uffdkvm.kernels.Kernel, not {type(kernel).__name__}", field="kernel")


def _import_path() -> list[str]:
    """This process's import path, this uffdkvm's first, so that the guest
    imports what this process imported (and not a source tree without the
    built extension in the directory it starts from)."""
    package_parent = str(pathlib.Path(__file__).resolve().parents[2])
    return [package_parent, *(p for p in sys.path if p and p != package_parent)]


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name}: expected a positive number, not {value!r}", field=name)


def _count(name: str, value: Any, least: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name}: expected an int of {least} or more, not {value!r}",
                          field=name)


class Guest(concurrent.futures.Executor):
    """A kernel booted under QEMU with uffdkvm ready to run in it.

    kernel          a Debian kernel's name ("6.1", "6.12", "6.18", "7.2",
                    "backports", "sid"), a bzImage's path, or a Kernel
                    (``uffdkvm.kernels.brought(image, modules)``)
    accel           "auto" (default: KVM where the host's KVM can nest,
                    else TCG), "kvm" or "tcg"
    memory_mib      the guest's memory (default 4096)
    cpus            its CPUs (default 2)
    hugepages       2 MiB huge pages it reserves (default 0)
    gigantic_pages  1 GiB pages it reserves at boot (default 0)
    call_timeout_s  how long one call may take before the Guest gives up
                    on it and stops (default 3600)
    boot_timeout_s  how long the kernel may take to boot (default 300)

    Booted when made; ``close()`` (or the end of a ``with`` block) powers
    it off. ``run(config)`` runs one experiment there; as an Executor it
    runs any importable function (``submit(uffdkvm.probe, config)``), one
    call at a time, in order. ``accel`` says which QEMU used and why;
    under TCG the guest is emulated, 5 to 50 times slower than hardware:
    compare runs with each other, never with a host's.
    """

    def __init__(self, kernel: Any, *, accel: str = "auto", memory_mib: int = MEMORY_MIB,
                 cpus: int = CPUS, hugepages: int = 0, gigantic_pages: int = 0,
                 call_timeout_s: float = CALL_TIMEOUT_S,
                 boot_timeout_s: float = BOOT_TIMEOUT_S,
                 _started_only: bool = False):
        for name, value in (("memory_mib", memory_mib), ("cpus", cpus)):
            _count(name, value, least=1)
        for name, value in (("hugepages", hugepages), ("gigantic_pages", gigantic_pages)):
            _count(name, value)
        _positive("call_timeout_s", call_timeout_s)
        _positive("boot_timeout_s", boot_timeout_s)
        reserved_mib = gigantic_pages * 1024 + hugepages * 2
        if reserved_mib >= memory_mib:
            raise ConfigError(
                f"memory_mib: {memory_mib} MiB cannot hold the {reserved_mib} MiB that "
                f"gigantic_pages={gigantic_pages} (1 GiB each) and hugepages={hugepages} "
                f"(2 MiB each) reserve; give more memory or reserve fewer pages",
                field="memory_mib")
        _qemu.check_tools()                       # before any fetch, as a bad accel is
        self.accel = _qemu.choose_accel(accel)
        self.kernel = resolve(kernel)
        self.call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[concurrent.futures.Future[Any], float]] = {}
        self._next = 0
        self._closed = False      # no more submits
        self._stopping = False    # _stop() ends QEMU: its end is no failure
        self._failure: BaseException | None = None
        self._dir = pathlib.Path(tempfile.mkdtemp(prefix="uffdkvm-guest-"))
        self._machine: _qemu.Machine | None = None
        try:
            (self._dir / "calls").mkdir()
            (self._dir / "replies").mkdir()
            job = _qemu.job_script(
                [["env", f"UFFDKVM_GUEST_HUGEPAGES={hugepages}", sys.executable, "-c",
                  _worker.START, str(self._dir), json.dumps(_import_path())]], os.getcwd())
            self._machine = _qemu.Machine(self.kernel, job, self._dir, accel=self.accel,
                                          memory_mib=memory_mib, cpus=cpus,
                                          gigantic_pages=gigantic_pages)
        except BaseException:
            self._stop(graceful=False)
            raise
        self._boot_timeout_s = boot_timeout_s
        self._asked = {"cpus": cpus, "hugepages": hugepages, "gigantic_pages": gigantic_pages}
        self.release = ""
        if not _started_only:  # else the caller boots several at once, then _until_ready()s
            self._until_ready()

    def _until_ready(self) -> None:
        """Waits for the worker to start, then hands its replies out."""
        try:
            self.release = self._wait_ready(self._boot_timeout_s)
        except BaseException:
            self._stop(graceful=False)
            raise
        # The watcher holds the Guest weakly, so that a Guest dropped unclosed
        # is collected and its QEMU ended (__del__).
        self._watcher = threading.Thread(target=_watch, args=(weakref.ref(self),),
                                         name="uffdkvm-guest", daemon=True)
        self._watcher.start()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        return f"<Guest {self.kernel.name} ({self.kernel.release}) {self.accel.name} {state}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def _wait_ready(self, timeout_s: float) -> str:
        assert self._machine is not None
        ready = self._dir / "ready.json"
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if not self._machine.running():
                raise HostUnsupportedError(
                    f"the {self.kernel} guest stopped before its worker started; its "
                    f"console ended:\n{self._machine.console_tail()}\nand its job's "
                    f"output:\n{self._job_log()}")
            if time.monotonic() > deadline:
                raise RunTimeoutError(f"the {self.kernel} guest did not start its worker "
                                      f"within boot_timeout_s={timeout_s:g} s; its console "
                                      f"ended:\n{self._machine.console_tail()}")
            time.sleep(POLL_S * 5)
        said = json.loads(ready.read_text())
        short = {k: (said.get(k), n) for k, n in self._asked.items() if said.get(k) != n}
        if short:
            raise HostUnsupportedError(
                f"the {self.kernel} guest has " + ", ".join(
                    f"{k}={got} where {asked} were asked" for k, (got, asked) in short.items())
                + f" (memory_mib={self._machine.memory_mib}: huge pages need memory "
                f"enough, and 1 GiB pages a kernel with them)")
        return str(said["release"])

    def _job_log(self) -> str:
        try:
            return "\n".join((self._dir / "job.log").read_text(errors="replace")
                             .splitlines()[-20:])
        except OSError:
            return "(none)"

    def submit(self, fn: Callable[..., Any], /, *args: Any,
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Runs ``fn(*args, **kwargs)`` in the guest (fn importable there: a
        module-level function of an installed module); a Future of what it
        returns or raises. Cancelling the Future before the worker takes
        the call takes the call back; after, its outcome is dropped."""
        assert self._machine is not None
        with self._lock:
            failed, closed = self._failure, self._closed
        if failed is None and not closed and not self._machine.running():
            self._fail(self._died())
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                raise RuntimeError("cannot submit to a closed Guest")
            if not callable(fn):
                raise TypeError(f"submit: fn must be callable, not {type(fn).__name__}")
            data = pickle.dumps((fn, args, kwargs))
            name = f"{self._next:08d}"
            self._next += 1
            _worker.write_whole(self._call(name), data)
            # A call's clock starts when the one before it is answered: the
            # worker takes them one at a time, in order (_answered).
            self._pending[name] = (future, 0.0 if self._pending else time.monotonic())
        future.add_done_callback(lambda f: self._take_back(name, f))
        return future

    def _call(self, name: str) -> pathlib.Path:
        return self._dir / "calls" / (name + _worker.CALL_SUFFIX)

    def _take_back(self, name: str, future: concurrent.futures.Future[Any]) -> None:
        """A cancelled call the worker has not taken (its file still there)
        is withdrawn; one it took runs on, and its outcome is dropped."""
        if not future.cancelled():
            return
        with self._lock:
            if name not in self._pending:
                return
            try:
                self._call(name).unlink()
            except FileNotFoundError:
                return
            self._answered(name)

    def _answered(self, name: str) -> None:
        """Drops a call from the pending ones and, if it was the one the
        worker had (the first), starts the next one's clock (with the lock
        held): a call taken back from the queue leaves the clock alone."""
        was_first = bool(self._pending) and name == min(self._pending)
        self._pending.pop(name, None)
        if was_first and self._pending:
            first = min(self._pending)
            self._pending[first] = (self._pending[first][0], time.monotonic())

    def run(self, config: Config | None = None, **fields: Any) -> Result:
        """Runs one experiment in the guest, as ``uffdkvm.run(config, **fields)``."""
        from ..run import run
        if config is not None and not isinstance(config, Config):
            raise ConfigError(f"config: expected a uffdkvm.Config, not "
                              f"{type(config).__name__}")
        config = (config or Config()).replace(**fields) if fields else (config or Config())
        future = self.submit(run, config)
        try:
            result: Result = future.result()
        except BaseException:
            future.cancel()     # a Ctrl-C here: the outcome is not wanted
            raise
        return result

    def _died(self) -> BaseException:
        """What a guest that stopped by itself gives its calls."""
        assert self._machine is not None
        return RunError(f"the {self.kernel} guest stopped; its console ended:\n"
                        f"{self._machine.console_tail()}\nand its job's output:\n"
                        f"{self._job_log()}; boot a new Guest")

    def _watch_once(self) -> bool:
        """One look at the replies: hands the first pending call's reply to
        its Future; fails them all if the guest died or that call overran
        call_timeout_s. False once there is nothing more to watch."""
        assert self._machine is not None
        with self._lock:
            if self._closed and not self._pending:
                return False
            first = min(self._pending) if self._pending else None
            started = self._pending[first][1] if first is not None else 0.0
        if first is not None:
            path = self._dir / "replies" / (first + _worker.REPLY_SUFFIX)
            if path.exists():
                try:
                    kind, value = pickle.loads(path.read_bytes())
                except Exception as e:
                    kind, value = "error", RunError(f"the guest's reply did not load: {e}")
                path.unlink(missing_ok=True)
                with self._lock:
                    entry = self._pending.get(first)
                    self._answered(first)
                if entry is not None:
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        if kind == "ok":    # (a cancelled Future takes neither)
                            entry[0].set_result(value)
                        else:
                            entry[0].set_exception(value)
                return True
            if started and time.monotonic() - started > self.call_timeout_s:
                self._fail(RunTimeoutError(
                    f"a call in the {self.kernel} guest took over call_timeout_s="
                    f"{self.call_timeout_s:g} s; the guest was stopped"))
                return False
        if not self._machine.running():
            # Ended by _stop (close, a failure): its calls are answered there.
            # Else it died by itself, and every pending call fails here.
            with self._lock:
                stopped_here = self._stopping
            if not stopped_here:
                self._fail(self._died())
            return False
        return True

    def _fail(self, error: BaseException) -> None:
        """Every pending call fails with ``error``, later submits raise it,
        and QEMU is ended."""
        with self._lock:
            if self._failure is None:
                self._failure = error
            pending, self._pending = self._pending, {}
        self._stop(graceful=False)
        for future, _ in pending.values():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Powers the guest off: after the calls submitted so far (wait=True)
        or at once (cancel_futures=True cancels them; the others then fail)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cancelled = [f for f, _ in self._pending.values()] if cancel_futures else []
        for future in cancelled:
            future.cancel()
        graceful = False
        try:
            if wait and not cancel_futures:
                while True:
                    with self._lock:
                        if not self._pending or self._failure is not None:
                            graceful = self._failure is None
                            break
                    time.sleep(POLL_S)
        finally:  # a second Ctrl-C while waiting still ends QEMU
            self._stop(graceful=graceful)

    def close(self) -> None:
        """Powers the guest off once the calls submitted so far are done."""
        self.shutdown(wait=True)

    def _stop(self, graceful: bool = True) -> None:
        """Powers the guest off: graceful, its worker told to end and the
        kernel let power off (30 s at most); else QEMU ended at once. An
        interrupt on the way (a second Ctrl-C) still fails the pending
        calls and removes the guest's directory."""
        with self._lock:
            self._closed = self._stopping = True
            pending, self._pending = self._pending, {}
        machine = self._machine
        try:
            if machine is not None:
                try:
                    if graceful and machine.running():
                        _worker.write_whole(self._dir / "calls" / _worker.STOP, b"")
                        machine.wait(30)
                finally:
                    machine.stop()
        finally:
            for future, _ in pending.values():
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(RunError(f"the {self.kernel} guest was powered "
                                                  f"off before the call was answered"))
            shutil.rmtree(self._dir, ignore_errors=True)

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        # An exception (Ctrl-C among them) powers off at once; else after the calls.
        self.shutdown(wait=kind is None, cancel_futures=kind is not None)

    def __del__(self) -> None:
        if not getattr(self, "_stopping", True):
            self._stop(graceful=False)


def _watch(guest_ref: weakref.ref[Guest]) -> None:
    """The watcher thread: watches while the Guest lives and has calls or
    may get them. Whatever goes wrong here fails every pending call: no
    Future is left waiting."""
    while True:
        guest = guest_ref()
        if guest is None:
            return
        try:
            if not guest._watch_once():
                return
        except BaseException as e:  # noqa: BLE001 - every caller is told
            guest._fail(RunError(f"the {guest.kernel} guest's replies could not be taken: "
                                 f"{type(e).__name__}: {e}"))
            return
        del guest
        time.sleep(POLL_S)
