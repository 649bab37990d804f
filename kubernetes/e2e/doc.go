// Package e2e holds the tests of package kubernetes/jobscale and of the
// manifests of examples/kubernetes against a real control plane: an
// embedded etcd, kube-apiserver and the Job controller of k8s.io/kubernetes,
// started once by TestMain, with a node agent that runs each Pod as a local
// process (there is no kubelet). It is a module of its own because
// k8s.io/kubernetes is heavy and needs its staging modules pinned by
// replace lines, which do not apply to dependents: users never import it.
// See docs/kubernetes.md.
package e2e
