// Command kube-scheduler is the upstream scheduler, built from Go modules for
// the local single-node cluster (`dbq dev up cluster`).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
