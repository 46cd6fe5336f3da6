// A multi-call binary: kube-apiserver, kube-controller-manager and kube-proxy linked
// once. It runs the component named by its file name (a symlink or copy named after
// the component), as the upstream mains do.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	_ "time/tzdata" // CronJob time zones, as the upstream mains

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric

	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-proxy":              proxy.NewProxyCommand,
	}
	name := filepath.Base(os.Args[0])
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: run me as kube-apiserver, kube-controller-manager or kube-proxy (a link with that name)\n", name)
		os.Exit(2)
	}
	os.Exit(cli.Run(newCommand()))
}
