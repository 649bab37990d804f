// Package kubernetes holds the deployment files of elastictrain's MNIST
// worker (manifests/, Dockerfile, and mnist/, the image's worker: the
// command of examples/mnist with checkpoints in S3-compatible object
// storage) and the tests that check them: every manifest decodes strictly
// against the Kubernetes API types, agrees with the worker's flags and the
// SDK's settings (grace period, ports, environment variables, the Redis and
// checkpoint wiring; no shared volume), and the workers started with the
// Job's own arguments train together, checkpointing to a real S3-compatible
// server, and a whole-job restart resumes from it. It is a module of its
// own, so the core module never depends on the Kubernetes API packages and
// the examples module never on an S3 client.
package kubernetes
