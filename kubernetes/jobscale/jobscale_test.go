package jobscale

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The scaler's tests against a real kube-apiserver and Job controller are
// in the module kubernetes/e2e; these cover what needs no server.

func pod(phase corev1.PodPhase, node string, conds ...corev1.PodCondition) corev1.Pod {
	return corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase, Conditions: conds}}
}

var unschedulable = corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}

func TestCountPods(t *testing.T) {
	deleting := pod(corev1.PodRunning, "n1")
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, c := range []struct {
		name                     string
		pods                     []corev1.Pod
		scheduled, unschedulable int
	}{
		{"none", nil, 0, 0},
		{"running", []corev1.Pod{pod(corev1.PodRunning, "n1"), pod(corev1.PodRunning, "n2")}, 2, 0},
		{"pending on a node counts as scheduled", []corev1.Pod{pod(corev1.PodPending, "n1")}, 1, 0},
		{"pending, not yet looked at by the scheduler", []corev1.Pod{pod(corev1.PodPending, "")}, 0, 0},
		{"unschedulable", []corev1.Pod{pod(corev1.PodRunning, "n1"), pod(corev1.PodPending, "", unschedulable)}, 1, 1},
		{"scheduling gated is not unschedulable", []corev1.Pod{pod(corev1.PodPending, "",
			corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated})}, 0, 0},
		{"terminated and deleted Pods do not count", []corev1.Pod{pod(corev1.PodSucceeded, "n1"), pod(corev1.PodFailed, "n1"), deleting}, 0, 0},
	} {
		s, u := CountPods(c.pods)
		if s != c.scheduled || u != c.unschedulable {
			t.Errorf("%s: CountPods = %d scheduled, %d unschedulable; want %d, %d", c.name, s, u, c.scheduled, c.unschedulable)
		}
	}
}

func TestNewRefusesABadConfig(t *testing.T) {
	for _, c := range []Config{{}, {Namespace: "ns"}, {Job: "j"}} {
		if _, err := New(nil, c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(nil, %+v) = %v; want ErrInvalidConfig", c, err)
		}
	}
}

func TestReleaseNeedsThePod(t *testing.T) {
	s := &Scaler{cfg: Config{Namespace: "ns", Job: "j"}}
	if err := s.Release(context.Background()); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Release without a Pod = %v; want ErrInvalidConfig", err)
	}
	if err := s.Resize(context.Background(), 0); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Resize(0) = %v; want ErrInvalidConfig", err)
	}
}
