"""A session driven from a thread that did not start it: a clear error at the call, and the session goes on."""

from __future__ import annotations

import threading

import kprof_callbacks as kprof


def test_calls_from_another_thread_are_a_clear_error_and_the_session_goes_on(tmp_path, train, check_traces):
    """torch.profiler steps and records the thread that started it: a step from another one was lost without a word
    (0 trace files, a line of torch's C++ on stderr), and two threads stepping at once crashed the export."""
    errors: dict[str, str] = {}

    def call(name: str, fn) -> None:
        try:
            fn()
        except RuntimeError as exc:
            errors[name] = str(exc)

    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=1, repeat=2, scalars=False) as s:
        calls = {"step": s.step, "region": lambda: s.region("x"), "arm": s.arm, "pause": s.pause}
        for name, fn in calls.items():
            thread = threading.Thread(target=call, args=(name, fn), name="loader")
            thread.start()
            thread.join()
        train(s, 4)
    assert set(errors) == set(calls)
    for name, message in errors.items():
        assert message.startswith(f"kprof: Session.{name}() called on thread 'loader', but the session was started on ")
        assert "thread 'MainThread'" in message
    assert s.steps == 4 and len(s.trace_files) == 2
    check_traces(tmp_path)


def test_a_session_started_on_a_thread_is_driven_from_it(tmp_path, train):
    """The training thread need not be the main one: only the thread that started the session drives it."""
    done: list[kprof.Session] = []

    def loop() -> None:
        with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=1, repeat=1, scalars=False) as s:
            train(s, 2)
        done.append(s)

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join()
    assert len(done[0].trace_files) == 1
