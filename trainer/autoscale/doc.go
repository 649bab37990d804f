// Package autoscale is resource adjustment for elastic jobs: it measures
// what a world size is worth (goodput from numbers every rank agrees on),
// decides a target world size with a pure, deterministic policy, and hands
// the decision to a Platform that enacts it (package launch for local
// processes; Kubernetes' own scaling on a cluster).
//
// It imports only the standard library.
package autoscale
