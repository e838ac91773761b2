// Command training-operator is the Kubeflow training operator v1, reduced to the PyTorchJob
// reconciler and its validating webhook. This mirrors cmd/training-operator.v1/main.go of
// github.com/kubeflow/training-operator (v1.9.4), minus the in-cluster certificate rotation
// (pkg/cert, which always rotates a Secret for a Service and serves from
// /tmp/k8s-webhook-server): the harness writes the webhook's serving certificate itself
// (--webhook-cert-dir) and registers the ValidatingWebhookConfiguration with a URL on
// 127.0.0.1, because there is no Service network to reach a host process behind a ClusterIP.

package main

import (
	"flag"
	"fmt"
	"os"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/flowcontrol"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	schedulerpluginsv1alpha1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"
	"volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"github.com/kubeflow/training-operator/pkg/config"
	"github.com/kubeflow/training-operator/pkg/controller.v1/common"
	pytorchcontroller "github.com/kubeflow/training-operator/pkg/controller.v1/pytorch"
	pytorchwebhook "github.com/kubeflow/training-operator/pkg/webhooks/pytorch"
)

func main() { os.Exit(run()) }

func run() int {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(kubeflowv1.AddToScheme(scheme))
	utilruntime.Must(v1beta1.AddToScheme(scheme))
	utilruntime.Must(schedulerpluginsv1alpha1.AddToScheme(scheme))

	var metricsAddr, probeAddr, webhookHost, webhookCertDir string
	var webhookPort, threads, qps, burst int
	flag.StringVar(&metricsAddr, "metrics-bind-address", "127.0.0.1:0", "Metrics address.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "127.0.0.1:8081", "Probe address.")
	flag.StringVar(&webhookHost, "webhook-host", "127.0.0.1", "Webhook server bind host.")
	flag.IntVar(&webhookPort, "webhook-server-port", 9443, "Webhook server port.")
	flag.StringVar(&webhookCertDir, "webhook-cert-dir", "",
		"Directory with tls.crt and tls.key; empty disables the validating webhook.")
	flag.IntVar(&threads, "controller-threads", 1, "Reconciler worker threads.")
	flag.IntVar(&qps, "kube-api-qps", 20, "Client QPS.")
	flag.IntVar(&burst, "kube-api-burst", 30, "Client burst.")
	flag.StringVar(&config.Config.PyTorchInitContainerImage, "pytorch-init-container-image",
		config.PyTorchInitContainerImageDefault, "The image for pytorch init container")
	flag.StringVar(&config.Config.PyTorchInitContainerTemplateFile, "pytorch-init-container-template-file",
		config.PyTorchInitContainerTemplateFileDefault, "The template file for pytorch init container")
	flag.IntVar(&config.Config.PyTorchInitContainerMaxTries, "pytorch-init-container-max-tries",
		config.PyTorchInitContainerMaxTriesDefault, "The number of tries for the pytorch init container")
	opts := zap.Options{Development: true, StacktraceLevel: zapcore.DPanicLevel}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	cfg := ctrl.GetConfigOrDie()
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(float32(qps), burst)
	mgrOpts := ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
	}
	if webhookCertDir != "" {
		mgrOpts.WebhookServer = webhook.NewServer(webhook.Options{
			Host: webhookHost, Port: webhookPort, CertDir: webhookCertDir,
		})
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		log.Error(err, "unable to start manager")
		return 1
	}
	if err := pytorchcontroller.NewReconciler(mgr, common.GenNonGangSchedulerSetupFunc()).
		SetupWithManager(mgr, threads); err != nil {
		log.Error(err, "unable to create the PyTorchJob controller")
		return 1
	}
	if webhookCertDir != "" {
		if err := pytorchwebhook.SetupWebhook(mgr); err != nil {
			log.Error(err, "unable to set up the PyTorchJob webhook")
			return 1
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "unable to set up health check")
		return 1
	}
	ready := healthz.Ping
	if webhookCertDir != "" {
		ready = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		log.Error(err, "unable to set up ready check")
		return 1
	}
	log.Info("starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintf(os.Stderr, "training-operator: %v\n", err)
		return 1
	}
	return 0
}
