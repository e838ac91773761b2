// Command coredns is CoreDNS v1.12.0 (kubeadm 1.33's version) with only the plugins the local
// cluster's DNS uses: it serves cluster.local from the API (kubernetes), so the training
// operator's headless per-replica Services (<job>-master-0) resolve to pod IPs.
//
// A module of its own, not a component of `kube`: CoreDNS v1.12.0's kubernetes plugin does not
// compile against client-go v0.33 (cache.Config.RetryOnError is gone), so it keeps the
// client-go it was released with (v0.31). Directive order is CoreDNS's own
// (core/dnsserver.Directives); only the plugins imported here are linked.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
