package kube

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// NewClient returns a client for the cluster that kubeconfig names or,
// when it is empty, $KUBECONFIG, ~/.kube/config, or the service account of
// the pod the worker runs in. It also returns the namespace that
// configuration names (in a pod, its own), a default for Config.Namespace.
func NewClient(kubeconfig string) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client configuration: %w", err)
	}
	namespace, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes namespace: %w", err)
	}
	cfg.UserAgent = "fleet-worker"
	// Each attempt makes a few calls; client-go's default of 5 per second
	// would hold a worker with many slots back.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client: %w", err)
	}
	return client, namespace, nil
}
