"""Temporary GPU diagnostics (not committed): Ctrl-C exit status, with and without kprof."""
import os, signal, subprocess, sys, tempfile, pathlib
HERE = pathlib.Path(__file__).parent
loop = HERE / "tests/faults/helpers/loop.py"
BUSY = ["--steps", "400", "--layers", "100", "--step-sleep", "0.05",
        "--option", "wait=0", "--option", "warmup=1", "--option", "active=2", "--option", "repeat=0",
        "--option", "record_shapes=True", "--option", "with_stack=True", "--option", "scalars=False"]

def ctrl_c(label, extra_args=(), extra_env=None, when="traces=1"):
    d = tempfile.mkdtemp()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(extra_env or {})}
    p = subprocess.Popen([sys.executable, str(loop), d, *BUSY, *extra_args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    for line in p.stdout:
        if when in line:
            break
    os.kill(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    lines = [l for l in err.splitlines() if not l.startswith("USDT") and l.strip()]
    print(f"== {label}: rc={p.returncode}")
    print("   " + "\n   ".join(lines[-14:]))

ctrl_c("control, no kprof", ["--option", "enabled=False"], when="step 20 ")
ctrl_c("control, no kprof, CUDA hidden", ["--option", "enabled=False"], {"CUDA_VISIBLE_DEVICES": ""}, when="step 20 ")
ctrl_c("kprof, CUDA hidden", extra_env={"CUDA_VISIBLE_DEVICES": ""})
ctrl_c("kprof, default (CPU+CUDA)")
