//go:build tools

package main

// Pins helm's command in go.mod/go.sum; it is built with `go build helm.sh/helm/v3/cmd/helm`.
import _ "helm.sh/helm/v3/cmd/helm"
