//go:build tools

// Package prometheustools pins Prometheus, whose server the local cluster builds unmodified
// (`go build -tags remove_all_sd,enable_kubernetes_sd github.com/prometheus/prometheus/cmd/prometheus`).
// This file only keeps it in go.mod and go.sum.
package prometheustools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
