// Package jobscale is a worker.Platform for Kubernetes: the workers of
// an Indexed Job whose spec.parallelism is the training job's world size
// size it through the Kubernetes API alone (client-go), with no operator
// and no custom resource.
//
// # What each call does
//
//   - Resize(target) (rank 0): raises spec.parallelism to target with a
//     JSON merge patch, as `kubectl patch job NAME --type=merge -p
//     '{"spec":{"parallelism":N}}'` does; the Job controller starts Pods
//     for the missing indexes and their workers join at a step boundary.
//     A lower target is enacted by Release.
//   - Release (a worker a decision removes): deletes its own Pod, then
//     lowers spec.parallelism by one, so the Job controller neither
//     replaces it nor deletes another Pod. The worker leaves gracefully
//     (exit 143, which the Job's podFailurePolicy ignores).
//   - Capacity (every rank): Pods of the Job that are Pending with
//     PodScheduled=False, reason Unschedulable, are capacity the cluster
//     does not have: the capacity is then the scheduled Pods, and the job
//     trains at that size instead of waiting; it grows when they start.
//
// An operator who patches spec.parallelism by hand scales the job the same
// way: the controller's new Pods join, the Pods it deletes get SIGTERM
// and leave gracefully.
//
// # Permissions
//
// A Role with get and patch on jobs and list and delete on pods in the
// Job's namespace (examples/kubernetes/manifests/rbac.yaml).
//
// This package lives in a module of its own
// (github.com/elastictrain/elastictrain/kubernetes) so that the core module
// does not depend on client-go. Its tests against a real kube-apiserver and
// Job controller are in the module kubernetes/e2e.
package jobscale
