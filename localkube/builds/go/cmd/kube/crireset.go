package main

// cri-reset stops and removes every pod sandbox (and any container left outside one) that a CRI
// runtime knows, through the CRI API: the runtime then tears down each pod's network (CNI DEL:
// veth, IP lease, iptables chains), unmounts its volumes and shm, and deletes its netns. The
// local cluster's `down` uses it to leave the machine as it found it (crictl rmp -af, which the
// Go module proxy does not serve).

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

func runCRIReset() int {
	fs := flag.NewFlagSet("cri-reset", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "CRI endpoint, e.g. unix:///run/ddpjob/containerd/containerd.sock")
	timeout := fs.Duration("timeout", 60*time.Second, "Overall deadline.")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "cri-reset: --endpoint is required (got none). Pass the runtime's socket as unix://PATH.")
		return 2
	}
	logger := klog.Background()
	rs, err := criclient.NewRemoteRuntimeService(*endpoint, 10*time.Second, nil, &logger)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: cannot reach the runtime (got %v). Is it running at %s?\n", err, *endpoint)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	failed := 0
	sandboxes, err := rs.ListPodSandbox(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: listing pod sandboxes failed (got %v)\n", err)
		return 1
	}
	for _, sb := range sandboxes {
		name := sb.GetMetadata().GetNamespace() + "/" + sb.GetMetadata().GetName()
		// StopPodSandbox stops the pod's containers and tears its network down; Remove deletes
		// the containers, the sandbox and its netns.
		if err := rs.StopPodSandbox(ctx, sb.Id); err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: stop sandbox %s (%s) failed: %v\n", name, sb.Id[:12], err)
			failed++
			continue
		}
		if err := rs.RemovePodSandbox(ctx, sb.Id); err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: remove sandbox %s (%s) failed: %v\n", name, sb.Id[:12], err)
			failed++
			continue
		}
		fmt.Printf("removed pod sandbox %s (%s)\n", name, sb.Id[:12])
	}
	containers, err := rs.ListContainers(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: listing containers failed (got %v)\n", err)
		return 1
	}
	for _, c := range containers {
		if err := rs.StopContainer(ctx, c.Id, 0); err == nil {
			err = rs.RemoveContainer(ctx, c.Id)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: remove container %s failed: %v\n", c.Id[:12], err)
			failed++
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}
