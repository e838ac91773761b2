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
# pause binary (localkube/images.py).
NODE_PACKAGES := containerd runc containernetworking-plugins iptables conntrack socat \
	podman buildah skopeo mmdebstrap busybox-static mksh uidmap gcc libc6-dev

# The real node's Debian packages come first (a no-op when installed); DDPJOB_NODE=off skips the node.
NODE_DEPS := $(if $(filter off,$(DDPJOB_NODE)),,node-deps)

# `make image`/`make push` build with docker where a daemon answers (`docker info`), else with
# podman (localkube/images.py: the upstream base when it can be had, else the local stand-in).
# Probed once, and only when one of them is asked for; CONTAINER_ENGINE=docker|podman overrides.
ifneq ($(filter image push,$(MAKECMDGOALS)),)
ifeq ($(origin CONTAINER_ENGINE),undefined)
CONTAINER_ENGINE := $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)
endif
endif
# Another base with the same contract (python, pip, CUDA torch 2.8.0); empty = the Dockerfile's.
BASE_IMAGE ?=

.PHONY: node-deps venv demo test test-fast lint fmt image base-image images push cluster-up cluster-down tools kind-up e2e bench schema

venv: $(STAMP)  ## create .venv and install ddpjob with every extra (torch included)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: venv  ## a real 2-process DDP run of the quickstart spec, on this machine
	$(PY) -m controller run $(SPEC) --local

# `tools` and `images` first, so a cold machine's one-time builds (Go: about 10-15 min on 2 cores;
# the stand-in torch base: minutes) print their progress outside pytest; on a warm machine they
# build nothing. Where the images cannot be built (no root or podman), the image tests say why.
test: venv tools $(NODE_DEPS)  ## the whole suite: unit, multi-process DDP, local control plane, images, end-to-end
	@$(MAKE) --no-print-directory images || echo "make test: images not built; see the image tests" >&2
	$(PY) -m ruff check .
	$(PY) -m pytest

test-fast: venv  ## everything that needs no control plane
	$(PY) -m pytest -m "not cluster"

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: venv
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

schema: venv  ## regenerate the checked-in JSON Schema of the job spec
	$(PY) -m controller schema > controller/spec.schema.json

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

e2e: venv $(NODE_DEPS)
	$(PY) -m pytest tests/e2e tests/localkube

bench: venv  ## benchmarks: ratios measured side by side in one run
	$(PY) bench/run.py

# With docker, exactly the build Docker users always had; with podman the same Dockerfile through
# localkube.images (containers.conf, the host's CA and pip.conf for pip, SOURCE_DIGEST for
# buildah's cache), which builds the stand-in base first when it has to.
image: $(if $(filter podman,$(CONTAINER_ENGINE)),$(STAMP))  ## build the CUDA trainer image: make image IMAGE=... TAG=...
ifeq ($(CONTAINER_ENGINE),docker)
	DOCKER_BUILDKIT=1 docker build $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE) )\
		--build-arg VERSION=$(TAG) \
		--build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		--build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
		-t $(IMAGE):$(TAG) .
else
	$(PY) -m localkube.images trainer --ref $(IMAGE):$(TAG) --version $(TAG)$(if $(BASE_IMAGE), --base $(BASE_IMAGE))
endif

base-image: venv  ## build the local stand-in for the trainer image's base (cached by its inputs)
	$(PY) -m localkube.images base

images: venv  ## build the local images into podman's store (stand-in base, pause, init); cached
	$(PY) -m localkube.images base
	$(PY) -m localkube.images pause
	$(PY) -m localkube.images init

push: image  ## build, then push $(IMAGE):$(TAG) (log in to the registry first)
	$(CONTAINER_ENGINE) push $(IMAGE):$(TAG)
