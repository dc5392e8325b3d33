"""The "kprof" TensorBoard tab, registered through the `tensorboard_plugins` entry point."""

from .plugin import KprofPlugin

__all__ = ["KprofPlugin"]
