// Command etcd is etcd's own server entry point, built from the Go module proxy so that the
// local control plane needs no release tarball (etcd's server/main.go does exactly this).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
