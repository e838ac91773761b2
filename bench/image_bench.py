"""Image bench: building the trainer image and bringing it into a containerd, side by side.

    python bench/image_bench.py     # root, podman, containerd; builds the stand-in base if missing

1. ``make image``'s build after a change to the trainer's code, with the base cached.
2. Into a throwaway containerd (its own root under ~/.cache/ddpjob/bench, removed after):
   cold (containerd has nothing), the same image again (a no-op), and the image after the
   code change two ways at once: ``import_into_containerd`` (only the layers containerd lacks)
   and the naive ``podman save --format docker-archive | ctr images import -`` (everything).
3. Sizes: the image by layer (``podman history``), the wheelhouse, containerd's root.

The code change is a file ``trainer/_bench_change.py`` written for the run and removed after.
Exit status 1 when the import after a code change is not at least 10x faster than the naive one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localkube.node import image_import  # noqa: E402
from tools import podman  # noqa: E402
from tools.base import base_image  # noqa: E402
from tools.cache import cache_dir  # noqa: E402

NAMESPACE = "ddpjob-bench"


def du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False)
    return int(out.stdout.split()[0]) if out.returncode == 0 else 0


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def timed(fn, *args, **kwargs):
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start


def make_image(ref: str) -> float:
    image, tag = ref.rsplit(":", 1)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    start = time.monotonic()
    subprocess.run(
        ["make", "--no-print-directory", "image", f"IMAGE={image}", f"TAG={tag}"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.monotonic() - start


def naive_import(ref: str, address: str) -> float:
    start = time.monotonic()
    save = subprocess.Popen(
        ["podman", "save", "--format", "docker-archive", ref],
        stdout=subprocess.PIPE,
        env=podman.podman_env(),
    )
    subprocess.run(
        ["ctr", "--address", address, "-n", NAMESPACE, "images", "import", "-"],
        stdin=save.stdout,
        check=True,
        capture_output=True,
    )
    save.stdout.close()
    assert save.wait() == 0
    return time.monotonic() - start


def history(ref: str) -> list[tuple[str, str]]:
    out = subprocess.run(
        ["podman", "history", "--format", "{{.Size}}\t{{.CreatedBy}}", ref],
        capture_output=True,
        text=True,
        env=podman.podman_env(),
        check=True,
    ).stdout
    return [tuple(line.split("\t", 1)) for line in out.splitlines()]


def main() -> int:
    base, base_s = timed(base_image)
    ref = f"localhost/ddpjob-bench:{uuid.uuid4().hex[:8]}"
    change = REPO / "trainer" / "_bench_change.py"
    work = cache_dir() / "bench" / f"containerd-{os.getpid()}"
    figures: dict[str, object] = {"base": base, "base_image_s": round(base_s, 1)}
    first_id = None  # the build before the code change, left untagged by the second
    try:
        figures["make_image_first_s"] = round(make_image(ref), 1)
        first_id = podman.inspect(ref)["Id"]
        with image_import.scratch_containerd(work) as address:
            cold = image_import.import_into_containerd(ref, address, NAMESPACE)
            same = image_import.import_into_containerd(ref, address, NAMESPACE)
            change.write_text(f"# bench: a code change ({uuid.uuid4()})\n")
            figures["make_image_after_code_change_s"] = round(make_image(ref), 1)
            warm = image_import.import_into_containerd(ref, address, NAMESPACE)
            naive_s = naive_import(ref, address)
            figures["containerd_root"] = gib(du_bytes(work / "root"))
        figures |= {
            "import_cold_s": round(cold.seconds, 1),
            "import_cold_sent": gib(cold.bytes_sent),
            "import_same_id_s": round(same.seconds, 2),
            "import_after_code_change_s": round(warm.seconds, 1),
            "import_after_code_change_sent_mib": round(warm.bytes_sent / 2**20, 1),
            "import_after_code_change_reused": gib(warm.bytes_reused),
            "naive_save_import_after_code_change_s": round(naive_s, 1),
            "wheelhouse": gib(du_bytes(cache_dir() / "wheelhouse")),
            "layers": [f"{size} {created_by[:60]}" for size, created_by in history(ref)],
        }
    finally:
        change.unlink(missing_ok=True)
        for image in (ref, first_id):
            if image:
                subprocess.run(
                    ["podman", "rmi", image], env=podman.podman_env(), capture_output=True
                )
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    ratio = figures["naive_save_import_after_code_change_s"] / max(
        figures["import_after_code_change_s"], 0.01
    )
    print(f"import after a code change: {ratio:.0f}x faster than podman save | ctr import")
    return 0 if ratio >= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
