# ddpjob — every install step lives here, so a fresh machine needs only `make demo` / `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
IMAGE ?= ghcr.io/ddpjob/trainer
TAG ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
SPEC ?= examples/quickstart.yaml
# What the local cluster's real node and the image build need from Debian (root, apt). runc, not
# crun: crun refuses this kernel's hybrid cgroups. See docs/local-cluster.md. busybox-static and
# mksh (its static shell) make the operator's init container image, gcc and libc6-dev the static
# pause binary (localkube/builds/images.py).
NODE_PACKAGES := containerd runc containernetworking-plugins iptables conntrack socat \
	podman buildah skopeo mmdebstrap busybox-static mksh uidmap gcc libc6-dev

# The real node's Debian packages come first (a no-op when installed); DDPJOB_NODE=off skips the node.
NODE_DEPS := $(if $(filter off,$(DDPJOB_NODE)),,node-deps)

# `make image`/`make push` build with docker where a daemon answers (`docker info`), else with
# podman (tools/image.py: the upstream base when it can be had, else the local stand-in).
# Probed once, and only when one of them is asked for; CONTAINER_ENGINE=docker|podman overrides.
ifneq ($(filter image push,$(MAKECMDGOALS)),)
ifeq ($(origin CONTAINER_ENGINE),undefined)
CONTAINER_ENGINE := $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)
endif
endif
# Another base with the same contract (python, pip, CUDA torch at the locked version); empty = the Dockerfile's.
BASE_IMAGE ?=

.PHONY: help node-deps venv lock demo test test-images test-fast lint fmt generate image base-image images push \
	cluster-up cluster-down tools kind-up e2e bench gpu-wheels gpu-dry-run

# First, so that a bare `make` lists the targets: each one's `## ...` comment is its description.
help:  ## list the targets and what each does
	@awk '/^[a-z][a-z0-9-]*:.*## / { name = $$0; sub(/:.*/, "", name); desc = $$0; \
		sub(/^[^#]*## /, "", desc); printf "  %-13s %s\n", name, desc }' $(firstword $(MAKEFILE_LIST))

venv: $(STAMP)  ## create .venv and install ddpjob with every extra (torch included), from uv.lock

# Exactly uv.lock, nothing resolved on the day: pip bootstraps uv at its locked version and hash
# (requirements/uv.txt), then `uv sync --frozen` installs every extra as locked, ddpjob editable.
# uv never fetches a Python of its own here. `make lock` changes the pins (tools/lock.py).
# Bytecode: without .pyc files, and with PYTHONDONTWRITEBYTECODE set (as on CI machines), every
# process compiles what it imports from source each time, torch included (4 s of CPU more for
# each trainer process). What the project's processes import is compiled here, once, by
# importing it in two processes side by side: torch with the compiler stack its optimizers load
# and the trainer (VENV_IMPORTS_TORCH), the CLI and the test tools (VENV_IMPORTS_TOOLS). The
# rest of the environment is compiled on first import (make test writes bytecode). Compiling
# every installed module instead (`uv sync --compile-bytecode`, as pip does by default) takes
# twice the CPU, for modules no process imports.
VENV_IMPORTS_TORCH := torch._dynamo torch.distributed.checkpoint torch.distributed.fsdp \
	trainer.train
VENV_IMPORTS_TOOLS := controller.cli.main kubernetes.client boto3 mlflow pytest hypothesis
venv_import = PYTHONDONTWRITEBYTECODE= $(PY) -c \
	"import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $(1)
$(STAMP): pyproject.toml uv.lock requirements/uv.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements/uv.txt
	UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=$(VENV) $(VENV)/bin/uv sync -q --frozen \
		--all-extras --python $(PY)
	$(call venv_import,$(VENV_IMPORTS_TORCH)) & torch=$$!; \
		$(call venv_import,$(VENV_IMPORTS_TOOLS)); tools=$$?; \
		wait $$torch && exit $$tools
	touch $(STAMP)

lock: venv  ## re-resolve the pins into uv.lock and write its views (requirements/); UPGRADE=1 moves every pin
	$(PY) -m tools.lock$(if $(UPGRADE), --upgrade)

demo: venv  ## a real 2-process DDP run of the quickstart spec, on this machine
	$(PY) -m controller run $(SPEC) --local

# make test, in phases (docs/testing.md gives each one's cold and warm time on 2 cores):
# 1. the node's Debian packages (a no-op when installed);
# 2. the one-time builds, the Go tools and the images (on a warm machine they build nothing;
#    logged to $(BUILD_LOG)); cold, they keep both CPUs busy. Then, in the background, the tests
#    that need neither, on $(OFFLINE_WORKERS) workers (logged to $(OFFLINE_LOG), printed when
#    they end), one at a time to each worker and in the order of tests/conftest.py's
#    _phase_order. Those run at nice $(OFFLINE_NICE): they fill the CPUs that the cluster tests
#    leave (the cluster tests' pods and daemons still share the CPUs with them: see
#    OFFLINE_NICE);
# 3. the cluster started once for phases 4 and 5 (both reuse it: a cluster their fixture started
#    would stop when the first of them ends and start again for the second), and stopped at the
#    end; a cluster that ran before make test is reused and left running. Then ruff;
# 4. beside the offline tests, alone, one at a time: the few that restart the API server or stop
#    the node (marker `disruptive`), and the examples as written, whose pods ask the node's every
#    CPU (`whole_node`: beside the other cluster tests they held the node while the others' pods
#    waited past their tests' timeouts). Mostly waiting, they leave the CPUs mostly idle; the
#    offline tests fill that, and nothing of the offline tests uses the node. Beside them too,
#    in the background (logged to $(IMAGES_LOG), printed at the end): the tests of what was
#    built that use no cluster (`built and not cluster`: the images, podman's containers, the
#    chart's templates), which touch neither the API server nor the node;
# 5. beside the offline tests still running: the tests on the local cluster, on $(TEST_WORKERS)
#    workers (each test has its own namespace; most of their time is
#    pods starting and waiting, which leaves the CPUs mostly idle when they run alone), in file
#    order, a few at a time to each worker: long and short tests side by side (the long ones all
#    at once take half again as long each, and more CPU).
# Every phase runs even when one before failed, so one run shows every failure.
# Without root or apt the node's packages cannot be installed: the suite still runs, and the tests
# that need the real node fail with one line that says why.
# The cluster tests' workers: most of a cluster test is pods starting and jobs waiting, and their
# pods ask 250m of the node's 2 CPUs each, so four tests of two pods fill the node.
TEST_WORKERS ?= 4
# The offline tests' workers: more than the CPUs, because many of those tests wait (a timeout, a
# throttled or stopped rank, a server's start) and a third worker fills what the other two leave.
OFFLINE_WORKERS ?= 3
# Their niceness. With autogroups (most distributions' default) it counts only within make test's
# session: the pods and the cluster's daemons, and what the tests start in sessions of their own,
# still share the CPUs with them as equals (docs/testing.md, phase 3). Within the session, beside
# the cluster tests' own processes (the CLI each e2e test runs, kubectl), nice 10 leaves them a
# tenth of a CPU; nice 19 leaves them 1.5 %, and their wall-clock timeouts (a collective's 60 s,
# an agent's exit) trip under it.
OFFLINE_NICE ?= 10
# Each phase ends with its slowest tests, so a CI log says where the time went.
DURATIONS ?= --durations=25 --durations-min=10
BUILD_LOG := build/make-test-builds.log
OFFLINE_LOG := build/make-test-offline.log
IMAGES_LOG := build/make-test-images.log
PYTEST := $(PY) -m pytest
# What a cold run takes of the disk: about 19 GB, the venv, caches and images included; a warm
# one takes less. Below it, make test says so first: short of disk, the failures say only "No
# space left on device", in image builds and in torch.compile's cache.
TEST_DISK_GB ?= 20
# $(call background,WHAT,LOG,COMMAND): COMMAND in the background of make test's recipe, its output
# in LOG, whose last line then says when WHAT ended (seconds since the recipe's $$start); $$! is
# its pid.
background = ( $(3); code=$$?; echo "$(1) done at $$(( $$(date +%s) - start ))s"; \
	exit $$code ) > $(2) 2>&1 &
# Bytecode is written while the tests run, even where PYTHONDONTWRITEBYTECODE is set (as on CI
# machines): they start hundreds of Python processes (each pytest worker collects every test
# module; the trainer and CLI processes they run), and without .pyc files each compiles this
# checkout's modules, and pytest rewrites the test modules' asserts, from source every time.
test test-fast e2e: export PYTHONDONTWRITEBYTECODE :=
test: venv  ## the whole suite: unit, multi-process DDP, local cluster, images, end-to-end
	@free=$$(df --output=avail -BG . /var/lib | tail -n +2 | tr -dc '0-9\n' | sort -n | head -n 1); \
	if [ -n "$$free" ] && [ "$$free" -lt $(TEST_DISK_GB) ]; then echo "make test: $${free} GB free" \
		"for the images, the node's containerd and the build caches; a cold run needs about" \
		"$(TEST_DISK_GB) GB, and short of it tests fail with 'No space left on device'" >&2; fi
	@$(if $(NODE_DEPS),$(MAKE) --no-print-directory node-deps || echo "make test: the node's \
		packages are missing; the tests that need the real node will say why" >&2,true)
	@mkdir -p $(dir $(BUILD_LOG)); t0=$$SECONDS; rc=0; start=$$(date +%s); \
	echo "make test: the Go tools and the images build first ($(BUILD_LOG)), then the offline" \
		"tests run in the background ($(OFFLINE_LOG)) beside the cluster tests"; \
	$(MAKE) --no-print-directory -j2 tools test-images > $(BUILD_LOG) 2>&1 \
		|| { tail -n 40 $(BUILD_LOG); rc=1; }; \
	$(call background,offline tests,$(OFFLINE_LOG),nice -n $(OFFLINE_NICE) $(PYTEST) $(DURATIONS) \
		-n $(OFFLINE_WORKERS) --phase-order --maxschedchunk 1 -m "not cluster and not built") \
		offline=$$!; \
	ours=; trap '[ -z "$$ours" ] || $(PY) -m localkube down >> $(BUILD_LOG) 2>&1' EXIT; \
	trap 'exit 130' INT TERM; \
	if ! $(PY) -m localkube status > /dev/null 2>&1; then ours=1; \
		$(PY) -m localkube up >> $(BUILD_LOG) 2>&1 || echo "make test: the cluster did not" \
			"start ($(BUILD_LOG)); the tests that need it say why" >&2; fi; t2=$$SECONDS; \
	grep -E "^\[(cluster|images)\] (built|tagged|wheelhouse|preloaded|not preloaded)" $(BUILD_LOG) || true; \
	$(PY) -m ruff check . || rc=1; \
	$(call background,image tests,$(IMAGES_LOG),$(PYTEST) $(DURATIONS) --built-only -m "built and not cluster") \
		beside=$$!; \
	$(PYTEST) $(DURATIONS) --built-only -m "disruptive or whole_node" || rc=1; t3=$$SECONDS; \
	$(PYTEST) $(DURATIONS) -n $(TEST_WORKERS) --built-only \
		-m "cluster and not (disruptive or whole_node)" || rc=1; t4=$$SECONDS; \
	wait $$beside || rc=1; wait $$offline || rc=1; t1=$$SECONDS; \
	echo "make test: the image tests ($(IMAGES_LOG)):"; cat $(IMAGES_LOG); \
	echo "make test: the offline tests ($(OFFLINE_LOG)):"; cat $(OFFLINE_LOG); \
	echo "make test: builds and the cluster up at $$((t2-t0))s, tests run alone" \
		"$$((t3-t2))s (beside them, $$(tail -n 1 $(IMAGES_LOG))), cluster tests $$((t4-t3))s," \
		"$$(tail -n 1 $(OFFLINE_LOG)) (waited for until $$((t1-t0))s); total $$((t1-t0))s"; \
	exit $$rc

test-images: venv  ## make images for make test, then preload them into the node's containerd
	@if $(MAKE) --no-print-directory images; then \
		$(PY) -m localkube preload || echo "make test: the node's images were not preloaded;" \
			"the cluster's up imports them" >&2; \
	else echo "make test: images not built; see the image tests" >&2; fi

test-fast: venv  ## everything that needs no cluster and no built image
	$(PYTEST) -n 2 --phase-order --maxschedchunk 1 -m "not cluster and not built"

lint: venv  ## ruff: lint and check formatting
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: venv  ## ruff: fix what it can and format
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

generate: venv  ## write every generated file: JSON Schemas, chart CI values, k8s example, goldens
	$(PY) -m controller.generate

cluster-up: venv $(NODE_DEPS)  ## build (once, cached) and start the local cluster: control plane + a real node
	$(PY) -m localkube up

cluster-down:  ## stop exactly what cluster-up started and remove its state
	$(PY) -m localkube down

node-deps:  ## install the Debian packages the real node and the image build need (root, apt)
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
			echo "node-deps: need root and apt-get to install: $$missing" >&2; exit 1; fi; \
		echo "node-deps: apt-get install $$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q $$missing >/dev/null; }; \
	fi

tools: venv  ## build the pinned control-plane binaries into the cache, start nothing
	$(PY) -m localkube build

kind-up:  ## for machines with Docker: a kind cluster with the Kubeflow training operator
	$(PY) -m localkube kind-up

e2e: venv $(NODE_DEPS)  ## the end-to-end and local-cluster tests only
	$(PY) -m pytest tests/e2e tests/localkube

bench: venv  ## benchmarks: ratios measured side by side in one run
	$(PY) bench/run.py

# The wheels a lent GPU machine's image lacks (requirements/gpu-wheels.txt, a view of uv.lock),
# for its Python (CPython 3.12, x86-64), checked against the lock's hashes: the device tool's run
# carries .whl/ (git-ignored) and bench/gpu/env.sh installs them there. typing-extensions goes to
# .whl/if-older/: env.sh adds it only where the image's is too old. See docs/gpu.md.
GPU_WHEEL_TARGET := --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64

gpu-wheels:  ## download into .whl/ the wheels a lent GPU machine lacks (docs/gpu.md)
	rm -rf .whl && mkdir -p .whl/if-older
	$(PYTHON) -m pip download -q $(GPU_WHEEL_TARGET) --require-hashes -d .whl \
		-r requirements/gpu-wheels.txt
	mv .whl/typing_extensions-*.whl .whl/if-older/
	@ls .whl/*.whl .whl/if-older/*.whl

# The runbook's one device call (bash bench/gpu/speed.sh), on CPU; compile=false: compiling on two
# cores takes minutes, and the dry run tests the harness, not the speed.
GPU_DRY_RUN_OUT ?= build/gpu-dry-run
gpu-dry-run: venv  ## the one GPU call of docs/gpu.md on CPU: the real trainer runs, GPU checks skipped
	mkdir -p $(GPU_DRY_RUN_OUT)
	OUT=$(GPU_DRY_RUN_OUT) PYTHON=$(PY) bash bench/gpu/speed.sh --cpu-dry-run --steps 8 \
		compile=false >/dev/null
	@echo "gpu-dry-run: the report is $(GPU_DRY_RUN_OUT)/speed.json, every run's output speed.log"

# With docker, exactly the build Docker users always had; with podman the same Dockerfile through
# tools.image (containers.conf, the host's CA and pip.conf for pip, no layer cache), which builds
# the stand-in base first when it has to.
image: $(if $(filter podman,$(CONTAINER_ENGINE)),$(STAMP))  ## build the CUDA trainer image: make image IMAGE=... TAG=...
ifeq ($(CONTAINER_ENGINE),docker)
	DOCKER_BUILDKIT=1 docker build $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE) )\
		--build-arg VERSION=$(TAG) \
		--build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		--build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
		-t $(IMAGE):$(TAG) .
else
	$(PY) -m tools.image trainer --ref $(IMAGE):$(TAG) --version $(TAG)$(if $(BASE_IMAGE), --base $(BASE_IMAGE))
endif

base-image: venv  ## build the local stand-in for the trainer image's base (cached by its inputs)
	$(PY) -m tools.image base

images: venv  ## build the local images into podman's store (base, pause, init, trainer); cached
	$(PY) -m tools.image base
	$(PY) -m localkube.builds.images pause
	$(PY) -m localkube.builds.images init
	$(PY) -m localkube.builds.images trainer

push: image  ## build, then push $(IMAGE):$(TAG) (log in to the registry first)
	$(CONTAINER_ENGINE) push $(IMAGE):$(TAG)
