package main

// The kubelet, as in k8s.io/kubernetes/cmd/kubelet/kubelet.go (v1.33.13): the local cluster's one
// real node runs it against containerd. The kubelet parses its own flags (DisableFlagParsing), so
// the global flags the other components link in do not reach it.

import (
	"k8s.io/component-base/cli"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func runKubelet() int { return cli.Run(kubelet.NewKubeletCommand()) }
