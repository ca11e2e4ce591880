// Command etcd is the upstream etcd server (the version Kubernetes pins),
// built from Go modules for the local test stack.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
