"""L5: the emulated multi-host cluster (network namespaces, veth, bridge, tc; needs root).

``hosts.py`` brings a cluster up and down, ``run.py`` runs a job on it, ``netns.py``
wraps ``ip netns`` and ``tc``, ``linkprobe.py`` measures a link. Apart from the job
launcher (:mod:`disttrain.launch`), which never needs root.
"""
