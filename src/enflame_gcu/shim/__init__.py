"""``enflame-container-runtime``: the OCI runtime wrapper that gives a container its GCUs.

``main`` (entry) parses the call with ``invocation`` and execs runc at once unless it is a
``create``/``run`` whose spec may ask for GCUs; then ``create`` reads the ``config``
(``toml_subset``), the ``request`` in the spec, answers it from ``prepared_edits`` or from
discovery through ``modifiers``, and saves the spec with ``oci``; ``log`` is its log file and
``launcher`` writes the installed program, an ``sh`` front that execs runc itself for every
call that cannot need a GCU and runs ``main`` (``python -IS``) for the rest, trusting the
config only through the verdict ``front`` leaves. Standard library only.
"""
