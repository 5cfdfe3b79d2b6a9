#!/usr/bin/env bash
# CI step: every Kubernetes manifest under deploy/k8s validates offline, strictly, against
# a pinned Kubernetes version (kubernetes-validate ships the schemas; no cluster needed).
# That the manifests agree with the services' own settings (ports, probes, the grace
# period against the drain) is checked by orders-service/tests/deploy.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VERSION=1.33
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import kubernetes_validate' 2>/dev/null; then
    .venv/bin/pip install -q 'kubernetes-validate==1.37.0'
fi
# kustomization.yaml files are kustomize's own configuration, not Kubernetes objects.
mapfile -t manifests < <(find deploy/k8s -name '*.yaml' ! -name kustomization.yaml | sort)
.venv/bin/kubernetes-validate --kubernetes-version "$KUBERNETES_VERSION" --strict --quiet "${manifests[@]}"
echo "${#manifests[@]} manifests valid against Kubernetes $KUBERNETES_VERSION (strict)"
