"""CLI: ``python -m localkube {build,up,down,status,load,preload,kind-up,kind-down}``.

``load REF [--as NAME]`` is ``kind load docker-image`` for the real node: podman's image REF
into the node's containerd (only the layers it lacks), also named NAME when given. ``preload``
puts the node's images into its containerd's root before any cluster starts (``make test``,
beside the Go build: ``node.images.preload_images``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .builds import gotools
from .cluster import ControlPlane
from .node import containerd, host, images
from .procs import LocalkubeError


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m localkube")
    parser.add_argument(
        "command",
        choices=("build", "up", "down", "status", "load", "preload", "kind-up", "kind-down"),
    )
    parser.add_argument("ref", nargs="?", help="load: an image in podman's store")
    parser.add_argument("--as", dest="name", help="load: also name it NAME on the node")
    args = parser.parse_args(argv)
    if (args.command == "load") != bool(args.ref):
        parser.error("an image reference goes with `load`, and only with it")
    if args.command.startswith("kind-"):
        from . import kind

        return kind.up() if args.command == "kind-up" else kind.down()
    cp = ControlPlane()
    try:
        if args.command == "build":
            start = time.monotonic()
            built = gotools.build()
            total = time.monotonic() - start
            if built:
                print(f"[cluster] built {', '.join(built)} in {total:.0f}s")
            else:
                print(f"[cluster] nothing to build ({gotools.tools_dir()})")
        elif args.command == "up":
            state = cp.up()
            rss, pss = cp.rss_mib(), cp.pss_mib()
            print(
                f"[cluster] control plane RSS {sum(rss.values()):.0f} MiB, "
                f"PSS {sum(pss.values()):.0f} MiB "
                f"({', '.join(f'{k} {v:.0f}' for k, v in rss.items())})",
                file=sys.stderr,
            )
            if "timings" in state:
                print(f"[cluster] timings {json.dumps(state['timings'])}", file=sys.stderr)
            print(cp.export_line())
        elif args.command == "down":
            cp.down()
        elif args.command == "preload":
            print(f"[images] {images.preload_images(cp.repo)}")
        elif args.command == "load":
            if not cp.is_live():
                raise LocalkubeError("localkube load: no cluster runs here. Run `make cluster-up`.")
            print(images.load(args.ref, args.name))
        else:
            live = cp.is_live()
            print(
                json.dumps(
                    {
                        "live": live,
                        "kubeconfig": str(cp.kubeconfig),
                        "tools": str(gotools.tools_dir()),
                        "rss_mib": cp.rss_mib(),
                        "pss_mib": cp.pss_mib(),
                        "node_shims": containerd.shim_memory_mib() if host.ENABLED else None,
                    },
                    indent=2,
                )
            )
            return 0 if live else 1
    except LocalkubeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
