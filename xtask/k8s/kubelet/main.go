// A multi-call binary: the kubelet and kube-scheduler (which binds the DaemonSet's
// pods to the node), as upstream's cmd/kubelet and cmd/kube-scheduler mains, built
// from the published k8s.io/kubernetes module, whose own go.mod cannot be built with
// `go install`. It runs the component named by its file name (a link with that name).
// A module apart from xtask/k8s/kubernetes so that the other components' pin and
// cached build stay as they are.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric

	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kubelet":        func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
		"kube-scheduler": func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	}
	name := filepath.Base(os.Args[0])
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: run me as kubelet or kube-scheduler (a link with that name)\n", name)
		os.Exit(2)
	}
	os.Exit(cli.Run(newCommand()))
}
