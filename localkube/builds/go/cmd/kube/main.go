// Command kube is one multi-call binary for the local control plane of ddpjob's tests.
//
// Usage: kube <component> [flags...] where component is one of etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok, kubectl, kubelet, cri-reset.
// The binary can also be invoked through a symlink named after the component (busybox style).
//
// Linking the components into one binary compiles and links the shared Kubernetes packages
// once, which is what keeps a cold build on a 2-core CI machine short.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = map[string]func() int{
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kwok":           runKwok,
	"kubectl": func() int {
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
	"kubelet":   runKubelet,
	"cri-reset": runCRIReset,
}

func names() string {
	out := make([]string, 0, len(components))
	for k := range components {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok {
		if len(os.Args) < 2 {
			fmt.Fprintf(os.Stderr, "kube: missing component (got none). Use one of: %s\n", names())
			os.Exit(2)
		}
		name = os.Args[1]
		// Shift argv so each component sees itself as the program and only its own flags.
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kube: unknown component (got %q). Use one of: %s\n", name, names())
		os.Exit(2)
	}
	os.Exit(run())
}
