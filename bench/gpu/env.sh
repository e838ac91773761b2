# shellcheck shell=bash
# Source it on a lent GPU machine, from the repo root, before bench/gpu/check.py:
#
#     . bench/gpu/env.sh && python3 bench/gpu/check.py ...
#
# It installs the wheels that `make gpu-wheels` put in .whl/ (the device tool's run carries
# them: carry [".whl"]) into /tmp/site, and puts /tmp/site first on PYTHONPATH: only what the
# machine's image lacks, nothing of the image replaced. Where every package of those wheels is
# already installed at its locked version (requirements/gpu-wheels.txt), as in the project's own
# .venv, there is nothing to install and it says so. typing-extensions (.whl/if-older/) goes
# in only when the image's is older than the installed wheels require. On failure it says why
# in one line and returns 4, gpu_check's exit code for a missing package.

_gpu_env_unmet() {
    # The requirements of the wheels in $1 that the Python path does not meet, by name.
    "$GPU_ENV_PY" - "$1" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, distributions, version

from packaging.requirements import Requirement

unmet = set()
for dist in distributions(path=[sys.argv[1]]):
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's or another platform's requirement
        try:
            met = req.specifier.contains(version(req.name), prereleases=True)
        except PackageNotFoundError:
            met = False
        if not met:
            unmet.add(f"{req.name}{req.specifier}")
print(" ".join(sorted(unmet)))
PY
}

_gpu_env_locked() {
    # Whether every package requirements/gpu-wheels.txt pins is installed at its pinned version.
    "$GPU_ENV_PY" - <<'PY'
import re
import sys
from importlib.metadata import PackageNotFoundError, version

text = open("requirements/gpu-wheels.txt", encoding="utf-8").read()
pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", text, flags=re.MULTILINE)


def installed(name: str, pinned: str) -> bool:
    try:
        return version(name) == pinned
    except PackageNotFoundError:
        return False


sys.exit(0 if pins and all(installed(n, v) for n, v in pins) else 1)
PY
}

_gpu_env() {
    local site="${GPU_SITE:-/tmp/site}" pip unmet
    GPU_ENV_PY="${PYTHON:-python3}"
    if _gpu_env_locked; then
        echo "gpu_env: $GPU_ENV_PY has every package of the wheels at its locked version;" \
            "nothing to install" >&2
        return 0
    fi
    pip=("$GPU_ENV_PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
        --upgrade --target "$site")
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "gpu_env: no wheels in .whl/ (got $(pwd)). Run 'make gpu-wheels' where the device" \
            "tool is called, and carry .whl" >&2
        return 4
    fi
    "${pip[@]}" .whl/*.whl || { echo "gpu_env: pip could not install .whl/*.whl" >&2; return 4; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    unmet=$(_gpu_env_unmet "$site") || return 4
    if [[ "$unmet" == *typing* ]] && compgen -G ".whl/if-older/*.whl" >/dev/null; then
        echo "gpu_env: the image's typing-extensions is too old ($unmet): adding .whl/if-older" >&2
        "${pip[@]}" .whl/if-older/*.whl || return 4
        unmet=$(_gpu_env_unmet "$site") || return 4
    fi
    if [[ -n "$unmet" ]]; then
        echo "gpu_env: still unmet after installing .whl: $unmet. Add them to the gpu-wheels group" \
            "in pyproject.toml, run make lock and make gpu-wheels again" >&2
        return 4
    fi
    echo "gpu_env: $site first on PYTHONPATH, with $(cd "$site" && echo *.dist-info | sed 's/\.dist-info//g')" >&2
}

_gpu_env
_gpu_env_rc=$?
unset -f _gpu_env _gpu_env_unmet _gpu_env_locked
unset GPU_ENV_PY
# shellcheck disable=SC2152
return $_gpu_env_rc 2>/dev/null || exit $_gpu_env_rc
