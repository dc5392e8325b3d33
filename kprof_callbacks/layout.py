"""The on-disk layout of a kprof logdir: every file name, pattern and folder rule is spelled here, once.

    <logdir>/<run>/                                   one session (under Lightning: <run>/<stage>)
        <worker>.<time_ns>.pt.trace.json[.gz]         a finished capture: complete by construction
        <finished name>.partial[.raw][.tmp]           a capture being written: every reader skips it
        events.out.tfevents.<time_ns>.<worker>        step-time scalars (tags below)
        <worker>.memory_snapshot.pickle               CUDA allocator history (memory_snapshot=True)
        <snapshot>.pickle.summary                     its summary, as kprof saved it (JSON)
        <worker>.oom.txt, <worker>.oom_snapshot.pickle    an out-of-memory report (oom_report), its snapshot
        <worker>.kprof-graphs.json                    the kernels torch.compile generated, by module and line (model=)
        PROFILE                                       a request for an on-demand capture
        .kprof-claim                                  which launch and session own the folder, and its processes
    <logdir>/compare.json                             a ``kprof.compare`` result

A worker is ``<host>_<pid>``, ``rank<R>_<host>_<pid>`` in distributed jobs (torch's tensorboard_trace_handler
names workers the same way). Every file is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

TRACE_SUFFIX = ".pt.trace.json"
TRACE_SUFFIXES = (TRACE_SUFFIX, TRACE_SUFFIX + ".gz")
JSON_SUFFIXES = (".json", ".json.gz")  # traces saved by hand with export_chrome_trace("x.json")
PARTIAL = ".partial"
COMPARE_FILE = "compare.json"
PROFILE_FILE = "PROFILE"
CLAIM_FILE = ".kprof-claim"
MODULE_PREFIX = "kprof.module:"  # a module call's range in a trace (module_ranges.py): the qualified name follows
GRAPHS_SUFFIX = ".kprof-graphs.json"  # a worker's record of compiled kernels (model=), not a trace
SNAPSHOT_SUFFIX = ".pickle"  # readers take any pickle in a run folder as a memory snapshot, as the tab shows them
SCALARS_PREFIX = "events.out.tfevents."  # TensorBoard finds event files by this prefix
TAG_PREFIX = "kprof/"  # every scalar kprof writes
STEP_TIME_TAG = "kprof/step_time_ms"  # the step without kprof's own cost (the wall time is step + profiler)
PROFILER_TAG = "kprof/profiler_ms"  # kprof's and torch.profiler's own work on the training thread after the step
AFTER_WINDOW_TAG = "kprof/after_window_ms"  # the steps right after a window, beyond the steps before it (its export)
THROUGHPUT_TAG = "kprof/throughput_samples_per_s"
TFLOPS_TAG = "kprof/tflops"  # achieved, from the FLOPs the program said each step does
MFU_TAG = "kprof/mfu"  # achieved / dense peak
PEAK_TAG = "kprof/peak_tflops"  # the peak MFU is measured against, once, at the first step
TRIGGER_TAG = "kprof/slow_step_trigger"  # its factor, once, at the first step, when the slow-step trigger was on
MEMORY_TAGS = {  # memory at sampled steps, MB
    "allocated": "kprof/mem_allocated_mb",  # CUDA caching allocator: tensors alive
    "reserved": "kprof/mem_reserved_mb",  # CUDA caching allocator: held from the driver
    "peak": "kprof/mem_peak_mb",  # CUDA: highest allocated since the previous sample
    "rss": "kprof/mem_rss_mb",  # the process's resident memory (host)
}

MACHINE_TAGS = {  # what the machine did, sampled every few steps (machine.py); rates are per step since the last sample
    "cpu_per_wall": "kprof/machine/cpu_per_wall",  # process CPU seconds per wall second (over 1: several threads)
    "cpu_wait": "kprof/machine/cpu_wait_share",  # the training thread's wait for a CPU (run queue) per wall second
    "load1": "kprof/machine/load1",  # the 1-minute load average
    "runnable": "kprof/machine/runnable",  # tasks runnable on the machine at the sample (this one included)
    "cpus": "kprof/machine/cpus",  # CPUs this process may run on, once, at the first sample
    "voluntary_switches": "kprof/machine/voluntary_switches",  # per step: waits the process chose (I/O, locks)
    "involuntary_switches": "kprof/machine/involuntary_switches",  # per step: preempted for other work
    "sm_clock": "kprof/gpu/sm_clock_mhz",
    "max_sm_clock": "kprof/gpu/max_sm_clock_mhz",
    "throttle": "kprof/gpu/throttle_reasons",  # NVML's clock throttle reasons that slow the GPU (machine.THROTTLES)
    "temperature": "kprof/gpu/temperature_c",
    "other_processes": "kprof/gpu/other_processes",  # other processes computing on the GPU
}

_PARTIAL = re.compile(r"^(?P<final>.+\.pt\.trace\.json(?:\.gz)?)\.partial(?:\..*)?$")
_SCALARS = re.compile(r"^events\.out\.tfevents\.\d+\.(?P<worker>.+)$")
_WORKER = re.compile(r"^(?P<worker>.+?)\.\d+\.pt\.trace\.json(?:\.gz)?$")
_RANK = re.compile(r"(?:^|[_.-])rank(\d+)(?:[_.-]|$)")


# -- names -------------------------------------------------------------------------------------------------------
def rank() -> int | None:
    """This process's rank in a distributed job (torch.distributed, else ``$RANK``), None when not distributed."""
    import torch.distributed as dist  # here, not at the top: reading traces must not import torch

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ["RANK"]) if "RANK" in os.environ else None


def worker_name(rank: int | None = None) -> str:
    """``<host>_<pid>``, prefixed ``rank<R>_`` when distributed."""
    name = f"{socket.gethostname()}_{os.getpid()}"
    return name if rank is None else f"rank{rank}_{name}"


def worker_of(path: Path) -> str:
    """The worker name in ``<worker>.<time_ns>.pt.trace.json[.gz]``."""
    match = _WORKER.match(path.name)
    return match["worker"] if match else path.name.split(".")[0]


def rank_of(worker: str) -> int | None:
    """The rank in a worker name such as ``rank3_host_123``, else None."""
    match = _RANK.search(worker)
    return int(match[1]) if match else None


def new_trace_path(run_dir: Path, worker: str, compress: bool) -> Path:
    """The final name of the next capture of ``worker``."""
    return run_dir / f"{worker}.{time.time_ns()}{TRACE_SUFFIXES[compress]}"


def partial_path(final: Path) -> Path:
    """The temporary name ``final`` is written under; readers never open it."""
    return final.with_name(final.name + PARTIAL)


def temp_paths(final: Path) -> list[Path]:
    """Every temporary file a write of ``final`` may leave: the partial file, the raw JSON of a gzip write, and the
    ``.tmp`` files torch's exporter writes before its own rename."""
    partial = partial_path(final)
    raw = partial.with_name(partial.name + ".raw")
    return [p.with_name(p.name + tmp) for p in (partial, raw) for tmp in ("", ".tmp")]


def raw_json_path(final: Path) -> Path:
    """Where a gzip-compressed capture's JSON is exported before compression (one of ``temp_paths``)."""
    return temp_paths(final)[2]


def scalars_path(run_dir: Path, worker: str) -> Path:
    """The TensorBoard event file of one session's step-time scalars."""
    return run_dir / f"{SCALARS_PREFIX}{time.time_ns()}.{worker}"


def scalar_files(folder: Path) -> list[tuple[str, Path]]:
    """``(worker, path)`` of every scalars event file directly inside ``folder`` (``scalars_path``'s names), by name."""
    return [(m["worker"], p) for p in sorted(folder.glob(SCALARS_PREFIX + "*")) if (m := _SCALARS.match(p.name))]


def snapshot_path(run_dir: Path, worker: str) -> Path:
    """The CUDA allocator history of one worker (open it at https://pytorch.org/memory_viz)."""
    return run_dir / f"{worker}.memory_snapshot{SNAPSHOT_SUFFIX}"


def oom_report_path(run_dir: Path, worker: str) -> Path:
    """The out-of-memory report of one worker (``oom_report=True``)."""
    return run_dir / f"{worker}.oom.txt"


def oom_snapshot_path(run_dir: Path, worker: str) -> Path:
    """The CUDA allocator history saved at an out-of-memory error (``oom_snapshot=True``)."""
    return run_dir / f"{worker}.oom_snapshot{SNAPSHOT_SUFFIX}"


def graphs_path(run_dir: Path, worker: str) -> Path:
    """The record of the kernels ``worker``'s compiled graphs run, with their modules and source lines."""
    return run_dir / f"{worker}{GRAPHS_SUFFIX}"


def check_name(what: str, name: str) -> str:
    """``name`` if it can be one folder's name and sit in a trace file (torch writes paths into traces unescaped),
    else a ValueError naming the character."""
    if name in ("", ".", "..") or Path(name).name != name:
        raise ValueError(f"{what} must be a plain folder name (no '/' or '..'), got {name!r}")
    for char in name:
        if char in '"\\' or not char.isprintable():  # control characters, lone surrogates, line separators
            raise ValueError(
                f"{what} {name!r} contains {char!r}, which cannot be written into a trace file: use "
                "letters, digits, spaces and -_."
            )
    return name


# -- run folders -------------------------------------------------------------------------------------------------
_SESSIONS: dict[Path, int] = {}  # run folder name -> how many sessions of this process asked for it
_SESSIONS_LOCK = threading.Lock()
_CLAIM_WAIT_S = 5.0  # how long a claim found empty (another rank of the launch is writing it) is re-read
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # a fault of the disk, not of the path: a session then trains unprofiled
_MEMBER = re.compile(r"^process (\d+) on (.*) \(boot ")  # a line of ``_process``


def make_run_dir(logdir: Path, run: str | None) -> Path:
    """Create the run folder of one session and check it is writable now; returns it as an absolute path, so that a
    later ``os.chdir`` changes nothing.

    ``run=None`` takes a fresh timestamped name, the same on every rank. A run folder belongs to one session of one
    launch: its ``.kprof-claim`` file, created exclusively, holds ``launch_id()`` (the same on every rank of a launch)
    and which of this process's sessions of that name it is. Where an earlier launch, or an earlier session of this
    process (a notebook cell run twice), claimed ``logdir/run``, this session writes to the next free ``<run>-2``,
    ``<run>-3``, ... and says so on stdout, so that two runs never look like one, nor two launches like ranks of one
    job. Every rank decides alike, without communicating. A full disk raises its own OSError (``DISK_FULL``); any
    other failure is a PermissionError that names the folder.
    """
    logdir = Path(logdir).expanduser().absolute()
    name = shared_run_name(logdir) if run is None else run
    with _SESSIONS_LOCK:
        session = _SESSIONS[logdir / name] = _SESSIONS.get(logdir / name, 0) + 1
    token = f"{launch_id()}, session {session}"
    n = 1
    while True:
        run_dir = logdir / (name if n == 1 else f"{name}-{n}")
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            if _claim(run_dir, token):
                break
        except (FileExistsError, NotADirectoryError):
            raise PermissionError(
                f"kprof cannot write traces to {run_dir}: {_file_in_the_way(run_dir)} is a file, "
                "not a folder; pass another logdir or run="
            ) from None
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise
            raise PermissionError(f"kprof cannot write traces to {run_dir}: {exc.strerror or exc}") from exc
        n += 1
    if n > 1 and rank() in (None, 0):
        print(f"kprof: {logdir / name} holds an earlier run; this one writes to {run_dir}", flush=True)
    return run_dir


def _file_in_the_way(path: Path) -> Path:
    """The first of ``path`` and its parents that exists and is not a folder."""
    return next((p for p in reversed([path, *path.parents]) if p.exists() and not p.is_dir()), path)


def _claim(run_dir: Path, token: str) -> bool:
    """Make ``run_dir`` the session ``token``'s unless another one has it; True when it is (now) ``token``'s.

    The claim holds the token, then a line per process that took the folder. Ranks of one launch run at once, so a
    claim of this launch whose processes have all ended is an earlier launch's that had the same token (two launches
    one after the other from one shell script: the same launcher process)."""
    if any(run_dir.glob(CLAIM_FILE + "-*")):  # claimed rank by rank by an older kprof: an earlier launch's
        return False
    path, me = run_dir / CLAIM_FILE, _process(os.getpid())
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        owner, *members = _read_claim(path).split("\n")
        if owner != token or (members and not any(map(_alive, members))):
            return False
        with open(path, "a") as claim:  # one small append: the ranks' lines never interleave
            claim.write(f"\n{me}")
        return True
    try:
        os.write(fd, f"{token}\n{me}".encode())
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):  # an empty claim would hold the folder for no one
            path.unlink()
        raise
    os.close(fd)
    return True


def release_run_dir(run_dir: Path) -> None:
    """Give back a folder this process claimed and wrote nothing to (its session could not start), so that the next
    session gets the name rather than ``<run>-2``; a folder that holds anything else, or that another process took
    too, is left as it is."""
    path = run_dir / CLAIM_FILE
    with contextlib.suppress(OSError, ValueError):
        if [p.name for p in run_dir.iterdir()] == [CLAIM_FILE] and path.read_text().split("\n")[1:] == [
            _process(os.getpid())
        ]:
            path.unlink()
            run_dir.rmdir()


def _alive(member: str) -> bool:
    """Whether the process a claim's line names still runs (a zombie does not); True for one of another host."""
    match = _MEMBER.match(member)
    if match is None or match[2] != socket.gethostname():
        return True
    pid = int(match[1])
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except ProcessLookupError:
        return False
    except (OSError, IndexError):  # no /proc (macOS): it exists
        state = "?"
    return state not in ("Z", "X") and _process(pid) == member


def _read_claim(path: Path) -> str:
    """The token in a claim file, waiting a moment while the rank that created it has not written it yet."""
    deadline = time.monotonic() + _CLAIM_WAIT_S
    while not (text := path.read_text(errors="replace")) and time.monotonic() < deadline:
        time.sleep(0.01)
    return text


def launch_id() -> str:
    """The launch this process belongs to, alike on every rank of it and different for the next launch.

    torchrun's run id where it has one (``--standalone``, ``--rdzv-id``, or a single-node launch; with its restart
    count); else, once torch.distributed is initialized, the first rank to ask, through the process group's store
    (no collective: ranks that start no session are not waited for); else, for a rank started before that (``RANK``
    set), the launcher process that started the ranks of this host; else this process. A process is named by host,
    boot, pid and start time, so that a container restarted with the same host name and pid 1 is a new launch.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id != "none":
        return f"torchelastic run {run_id}, restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    from . import torch_compat  # imports torch, which readers of a logdir never need

    own = _process(os.getpid())
    first = torch_compat.first_to_store("kprof/launch", own)
    if first is not None:
        return "ranks of the process group of " + first
    if "RANK" in os.environ:
        return "ranks started by " + _process(os.getppid())
    return own


def _process(pid: int) -> str:
    """Host, boot id, pid and start time (clock ticks after boot) of process ``pid``, as far as the OS tells."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        started = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):  # no /proc (macOS): host and pid alone
        boot = started = "?"
    return f"process {pid} on {socket.gethostname()} (boot {boot}), started at tick {started}"


def shared_run_name(logdir: Path) -> str:
    """A readable, unused run name (``YYYYmmdd-HHMMSS[-N]``), the same on every rank of a distributed job."""
    import torch.distributed as dist

    name = None
    if rank() in (None, 0):
        base = time.strftime("%Y%m%d-%H%M%S")
        name, n = base, 1
        while (logdir / name).exists():
            n += 1
            name = f"{base}-{n}"
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [name]
        dist.broadcast_object_list(box, src=0)
        name = box[0]
    if name is None:
        raise RuntimeError("RANK is set but torch.distributed is not initialized: pass run= explicitly")
    return name


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` under a temporary name and rename it into place: a reader never sees half a file."""
    tmp = path.with_name(path.name + PARTIAL)
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- reading -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunContents:
    """The kprof files directly inside one folder."""

    traces: list[Path]  # finished trace files
    partial: list[Path]  # captures still being written: one ``<final>.partial`` entry per capture
    snapshots: list[Path]  # memory snapshots
    comparison: Path | None  # a compare.json

    @property
    def is_run(self) -> bool:
        return bool(self.traces or self.partial)


def _is_file(path: Path, suffixes: tuple[str, ...]) -> bool:
    return path.name.endswith(suffixes) and path.is_file()


def contents(folder: Path, *, any_json: bool = False) -> RunContents:
    """What ``folder`` holds. With ``any_json``, a folder without ``.pt.trace.json[.gz]`` files takes every
    ``.json[.gz]`` file as a trace (traces saved with ``export_chrome_trace``)."""
    entries = sorted(folder.iterdir())
    traces = [p for p in entries if _is_file(p, TRACE_SUFFIXES)]
    if not traces and any_json:
        traces = [
            p
            for p in entries
            if _is_file(p, JSON_SUFFIXES) and p.name != COMPARE_FILE and not p.name.endswith(GRAPHS_SUFFIX)
        ]
    in_flight = {m["final"] for p in entries if (m := _PARTIAL.match(p.name))}
    compare = folder / COMPARE_FILE
    return RunContents(
        traces=traces,
        partial=[partial_path(folder / final) for final in sorted(in_flight)],
        snapshots=[p for p in entries if _is_file(p, (SNAPSHOT_SUFFIX,))],
        comparison=compare if compare in entries else None,
    )


def walk(logdir: Path) -> Iterator[tuple[Path, RunContents]]:
    """Every folder below ``logdir`` (itself first, then parents before children, siblings by name) with its
    contents; folders that vanish while walking are skipped."""
    for dirpath, dirnames, _ in os.walk(logdir):
        dirnames.sort()
        try:
            yield Path(dirpath), contents(Path(dirpath))
        except (FileNotFoundError, NotADirectoryError):
            continue


def find_runs(logdir: Path) -> dict[str, Path]:
    """Run folders below ``logdir`` (folders holding trace files), by path relative to ``logdir``."""
    return {run_name(logdir, folder): folder for folder, found in walk(logdir) if found.is_run}


def run_name(logdir: Path, folder: Path) -> str:
    """A run's name as the tab and TensorBoard's run list show it: its path relative to ``logdir``, '/'-separated."""
    return folder.relative_to(logdir).as_posix()
