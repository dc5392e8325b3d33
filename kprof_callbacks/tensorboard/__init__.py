"""TensorBoard: the "kprof" tab (``plugin``, registered through the ``tensorboard_plugins`` entry point) and the
``kprof tensorboard`` launcher (``launch``). Nothing is imported here, so the launcher loads without TensorBoard."""
