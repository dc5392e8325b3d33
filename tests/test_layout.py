"""layout.py spells every name on disk; readers find files by its patterns, not their own."""

from kprof_callbacks import layout


def test_scalar_files_are_the_event_files_scalars_path_names(tmp_path):
    written = layout.scalars_path(tmp_path, "rank0_host_12")
    written.write_bytes(b"")
    (tmp_path / "events.out.tfevents.later").write_bytes(b"")  # no time stamp: not kprof's
    (tmp_path / "host_12.1.pt.trace.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    layout.scalars_path(tmp_path / "sub", "host_12").write_bytes(b"")  # not directly inside the folder
    assert layout.scalar_files(tmp_path) == [("rank0_host_12", written)]
