// Command mnist is elastictrain's main example: a gorgonia model trained on
// the real MNIST files by several local worker processes that rendezvous
// through Redis (an embedded Redis-protocol server unless -redis is given),
// survive injected faults, and print the test accuracy.
//
//	go run ./examples/mnist                      # 2 workers, embedded store
//	go run ./examples/mnist -workers 3 -kill 1@300 -join 1@600 -json
//
// Run with -h for every flag. The command is package
// examples/internal/mnist (its code and tests live there), which the
// Kubernetes example's worker image runs too.
package main

import (
	"os"

	"github.com/elastictrain/elastictrain/examples/internal/mnist"
)

func main() {
	os.Exit(mnist.Main(os.Args[1:], os.Stdout, os.Stderr, mnist.Options{}))
}
