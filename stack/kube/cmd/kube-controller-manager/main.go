// Command kube-controller-manager is the upstream controller manager, built
// from Go modules for the local single-node cluster (`dbq dev up cluster`).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
