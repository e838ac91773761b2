"""The product's build, apart from the local cluster: the trainer image with podman (``make
image``, ``make base-image``) and the lock (``make lock``).

    cache.py           ~/.cache/ddpjob, file locks, short digests (cache keys)
    podman.py          running podman/buildah/skopeo; one build-once helper for every image
    base.py            the local stand-in for the trainer image's base (torch-base)
    image.py           the Dockerfile built with podman, on upstream's base or the stand-in
    wheelhouse.py      the wheels of a view of the lock, for an image's Python
    lock.py            uv.lock and the requirements files exported from it

Standard library only. ``localkube`` (the local cluster) imports from here, never the reverse:
``tests/test_layout.py`` holds it.
"""
