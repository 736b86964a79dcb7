#!/usr/bin/env bash
# Regenerates everything under api/ that is derived from the Go types:
#
#   api/policy/zz_generated.deepcopy.go, api/cilium.io/*/zz_generated.deepcopy.go
#                                   controller-gen object
#   api/crds/cilium.io_*.yaml       controller-gen crd
#   api/client/clientset/versioned  client-gen
#   api/client/listers              lister-gen
#   api/client/informers/externalversions
#                                   informer-gen
#
# The generators are the versions pinned in go.mod (see tools.go), run with
# `go run`; nothing is fetched beyond the Go module proxy and no GOPATH layout
# is assumed. Old output is removed first, so files of deleted types do not
# linger. The script works on the module it lives in: run it from anywhere as
#
#   hack/update-codegen.sh
#
# api/generate_test.go runs it on a copy of the tree to detect stale output.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"

export GOWORK=off
module="$(go list -m)"
header="hack/boilerplate.go.txt"
api_pkgs=("${module}/api/cilium.io/v2" "${module}/api/cilium.io/v2alpha1")
client_pkg="${module}/api/client"

echo "cleaning old output" >&2
rm -f api/policy/zz_generated.deepcopy.go api/cilium.io/*/zz_generated.deepcopy.go
rm -f api/crds/*.yaml
rm -rf api/client

echo "controller-gen object" >&2
go run sigs.k8s.io/controller-tools/cmd/controller-gen \
	object:headerFile="${header}" \
	paths=./api/policy/... paths=./api/cilium.io/...

echo "controller-gen crd" >&2
go run sigs.k8s.io/controller-tools/cmd/controller-gen \
	crd:crdVersions=v1 \
	paths=./api/cilium.io/... \
	output:crd:artifacts:config=api/crds

echo "client-gen" >&2
go run k8s.io/code-generator/cmd/client-gen \
	--go-header-file "${header}" \
	--clientset-name versioned \
	--input-base "${module}/api" \
	--input cilium.io/v2 \
	--input cilium.io/v2alpha1 \
	--output-dir api/client/clientset \
	--output-pkg "${client_pkg}/clientset"

echo "lister-gen" >&2
go run k8s.io/code-generator/cmd/lister-gen \
	--go-header-file "${header}" \
	--output-dir api/client/listers \
	--output-pkg "${client_pkg}/listers" \
	"${api_pkgs[@]}"

echo "informer-gen" >&2
go run k8s.io/code-generator/cmd/informer-gen \
	--go-header-file "${header}" \
	--versioned-clientset-package "${client_pkg}/clientset/versioned" \
	--listers-package "${client_pkg}/listers" \
	--output-dir api/client/informers \
	--output-pkg "${client_pkg}/informers" \
	"${api_pkgs[@]}"
