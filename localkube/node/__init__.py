"""The real node, the one that runs every pod: the machine under it and how it is put back
(``host.py``), containerd and the CNI bridge (``containerd.py``), the kubelet (``kubelet.py``),
cluster DNS (``coredns.py``), the images it holds (``images.py``, ``image_import.py``), local
PersistentVolumes (``volumes.py``) and pod logs kept past the kubelet's cleanup
(``podlogs.py``)."""
