//go:build tools

// Package trainertools pins Kubeflow Trainer v2 and JobSet for the local cluster. Their commands
// are built unmodified with `go build github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager`
// and `go build sigs.k8s.io/jobset`; this file only keeps them in go.mod and go.sum.
package trainertools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
)
