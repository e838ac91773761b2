//go:build tools

// Package operatortools pins the operators of the local cluster that need k8s.io v0.36: Kubeflow
// Trainer v2, JobSet and Kueue, whose commands are built unmodified (`go build
// github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager`, `go build sigs.k8s.io/jobset`,
// `go build sigs.k8s.io/kueue/cmd/kueue`), and the training operator v1 (PyTorchJob), whose
// reduced main is ./cmd/training-operator. This file only keeps them in go.mod and go.sum.
package operatortools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
