// Package kubernetes holds the deployment files of elastictrain's MNIST
// worker (manifests/ and Dockerfile) and the tests that check them: every
// manifest decodes strictly against the Kubernetes API types, agrees with
// the worker's flags and the SDK's settings (grace period, ports,
// environment variables, the Redis and checkpoint wiring), and the workers
// started with the Job's own arguments train together. It is a module of its
// own, so the core module never depends on the Kubernetes API packages.
package kubernetes
