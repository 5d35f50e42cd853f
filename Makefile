# Copyrator: `make test` runs every check against a local control plane;
# `make demo` shows the operator at work.
SHELL := /bin/bash

.PHONY: test demo demo-down bench bench-quick bench-throttled bench-tenants bench-matrix image e2e crd cluster-up cluster-down

test:
	hack/test

demo:
	hack/demo

demo-down:
	hack/demo down

bench:
	hack/bench

bench-quick:
	hack/bench --quick

# Writes throttled by API Priority and Fairness: the operator against a plain
# client on one priority level (a fault test, run alone with its targets held).
bench-throttled:
	hack/bench-throttled

bench-tenants:
	hack/bench-tenants

# The benchmark at several sizes, each on a fresh control plane, and one
# table: `make bench-matrix SIZES="10k 1000rules 100k"` (default: 10k and
# 1000rules). Not part of `make test`.
bench-matrix:
	hack/bench-matrix $(SIZES)

# The image as an OCI archive, built offline (see the Dockerfile).
image:
	hack/image

# The image (built, or reused from the benchmark's build) and its checks,
# then the chart on a kubelet node of its own with that image (root). CI
# runs it after `make test`.
e2e:
	hack/image
	hack/image-test
	hack/e2e

# Regenerate the CRD YAML from the Rust types (crd/ and chart/crds/).
crd:
	cargo run --quiet -- crd > crd/copyrator.yaml
	cp crd/copyrator.yaml chart/crds/copyrator.yaml

cluster-up:
	@hack/cluster up

cluster-down:
	@hack/cluster down
