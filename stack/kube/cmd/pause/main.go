// Command pause holds a pod's namespaces until it is told to stop: the sandbox image of the
// local single-node cluster, built here (no image registry is reachable).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	fmt.Println("pause: holding the pod's namespaces")
	<-stop
}
