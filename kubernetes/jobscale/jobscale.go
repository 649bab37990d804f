package jobscale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/elastictrain/elastictrain/worker"
)

// Environment variables that FromEnv reads; the Job's Pod template sets
// them through the downward API (see the manifests in
// examples/kubernetes/manifests).
const (
	// EnvNamespace holds the Pod's namespace (fieldRef metadata.namespace).
	EnvNamespace = "POD_NAMESPACE"
	// EnvPod holds the Pod's name (fieldRef metadata.name).
	EnvPod = "POD_NAME"
	// EnvJob holds the Job's name (fieldRef
	// metadata.labels['batch.kubernetes.io/job-name']).
	EnvJob = "JOB_NAME"
)

// LabelJobName is the label the Job controller puts on every Pod of a Job:
// the Job's name.
const LabelJobName = "batch.kubernetes.io/job-name"

// ErrInvalidConfig is wrapped by New's error for a Config it refuses.
var ErrInvalidConfig = errors.New("jobscale: invalid config")

// ErrNotIndexed is wrapped by the errors of Resize and Release when the Job
// has no spec.parallelism to set (it is not there, or the object is no Job
// of the expected shape).
var ErrNotIndexed = errors.New("jobscale: the Job has no parallelism")

// Config names the Job the scaler sizes and the Pod of the calling worker.
type Config struct {
	// Namespace of the Job and its Pods. Required.
	Namespace string
	// Job is the Job's name. Required.
	Job string
	// Pod is the calling worker's own Pod; Release deletes it. "" when
	// the caller runs in no Pod of the Job (a controller that only
	// resizes): Release then fails.
	Pod string
}

// Validate reports a missing field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Namespace == "":
		return fmt.Errorf("%w: no namespace (set $%s from the downward API's metadata.namespace)", ErrInvalidConfig, EnvNamespace)
	case c.Job == "":
		return fmt.Errorf("%w: no Job name (set $%s from the label %s)", ErrInvalidConfig, EnvJob, LabelJobName)
	}
	return nil
}

// FromEnv returns the Config of the Pod it runs in, from $POD_NAMESPACE,
// $POD_NAME and $JOB_NAME. It does not validate: New does.
func FromEnv() Config {
	return Config{Namespace: os.Getenv(EnvNamespace), Pod: os.Getenv(EnvPod), Job: os.Getenv(EnvJob)}
}

// Scaler is a worker.Platform for the workers of an Indexed Job: it
// sizes the Job through the Kubernetes API alone, with no operator or
// custom resource. It is safe for concurrent use.
//
// The API calls it makes are those of the Role in
// examples/kubernetes/manifests/rbac.yaml: get and patch on jobs, list and
// delete on pods.
type Scaler struct {
	client kubernetes.Interface
	cfg    Config
}

var _ worker.Platform = (*Scaler)(nil)

// New returns a Scaler of cfg's Job that calls the API through client.
func New(client kubernetes.Interface, cfg Config) (*Scaler, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: no client", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Scaler{client: client, cfg: cfg}, nil
}

// Parallelism returns the Job's spec.parallelism.
func (s *Scaler) Parallelism(ctx context.Context) (int, error) {
	job, err := s.client.BatchV1().Jobs(s.cfg.Namespace).Get(ctx, s.cfg.Job, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("jobscale: reading Job %s/%s: %w", s.cfg.Namespace, s.cfg.Job, err)
	}
	if job.Spec.Parallelism == nil {
		return 0, fmt.Errorf("%w: Job %s/%s", ErrNotIndexed, s.cfg.Namespace, s.cfg.Job)
	}
	return int(*job.Spec.Parallelism), nil
}

// SetParallelism sets the Job's spec.parallelism to n (>= 0) with a JSON
// merge patch, as `kubectl patch job NAME --type=merge -p
// '{"spec":{"parallelism":N}}'` does. The Job controller then starts Pods
// for the lowest indexes that are neither running nor complete, or, when
// n is below the Pods running, deletes Pods of its own choosing (which
// leave gracefully on their SIGTERM).
func (s *Scaler) SetParallelism(ctx context.Context, n int) error {
	if n < 0 {
		return fmt.Errorf("%w: parallelism %d below 0", ErrInvalidConfig, n)
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"parallelism": n}})
	_, err := s.client.BatchV1().Jobs(s.cfg.Namespace).Patch(ctx, s.cfg.Job, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("jobscale: setting the parallelism of Job %s/%s to %d: %w", s.cfg.Namespace, s.cfg.Job, n, err)
	}
	return nil
}

// Resize raises the Job's parallelism to target when it is lower; a lower
// target is left to the workers the decision removes (Release), because
// lowering the parallelism first would let the Job controller delete Pods
// of its own choosing rather than the ones the decision named.
func (s *Scaler) Resize(ctx context.Context, target int) error {
	if target < 1 {
		return fmt.Errorf("%w: resize to %d, want at least 1", ErrInvalidConfig, target)
	}
	cur, err := s.Parallelism(ctx)
	if err != nil {
		return err
	}
	if target <= cur {
		return nil
	}
	return s.SetParallelism(ctx, target)
}

// Release takes the calling worker's Pod out of the Job for good: it
// deletes the Pod (the kubelet's SIGTERM finds the worker already
// leaving; the Pod's terminationGracePeriodSeconds must cover its commit),
// and then lowers the Job's parallelism by one, so the Job controller
// neither replaces the Pod nor picks another one to delete. The order
// matters: a deleted Pod no longer counts as active, and a Job with a
// podFailurePolicy (podReplacementPolicy Failed) starts no replacement for
// it until it has terminated, by which time the parallelism is lower.
// A Pod already gone is not an error.
func (s *Scaler) Release(ctx context.Context) error {
	if s.cfg.Pod == "" {
		return fmt.Errorf("%w: Release needs the worker's own Pod (set $%s from metadata.name)", ErrInvalidConfig, EnvPod)
	}
	err := s.client.CoreV1().Pods(s.cfg.Namespace).Delete(ctx, s.cfg.Pod, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("jobscale: deleting Pod %s/%s: %w", s.cfg.Namespace, s.cfg.Pod, err)
	}
	return s.decrement(ctx)
}

// decrement lowers spec.parallelism by one with a JSON patch that tests
// the value it read, as `kubectl patch job NAME --type=json` would, and
// reads again when another writer changed it in between (two workers
// released by one decision do this at the same time).
func (s *Scaler) decrement(ctx context.Context) error {
	for {
		cur, err := s.Parallelism(ctx)
		if err != nil {
			return err
		}
		if cur <= 0 {
			return nil
		}
		patch := fmt.Sprintf(`[{"op":"test","path":"/spec/parallelism","value":%d},{"op":"replace","path":"/spec/parallelism","value":%d}]`, cur, cur-1)
		_, err = s.client.BatchV1().Jobs(s.cfg.Namespace).Patch(ctx, s.cfg.Job, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		switch {
		case err == nil:
			return nil
		case apierrors.IsInvalid(err) || apierrors.IsConflict(err):
			// The test failed: someone else changed it; read again.
			if ctx.Err() != nil {
				return fmt.Errorf("jobscale: lowering the parallelism of Job %s/%s: %w", s.cfg.Namespace, s.cfg.Job, ctx.Err())
			}
			continue
		default:
			return fmt.Errorf("jobscale: lowering the parallelism of Job %s/%s: %w", s.cfg.Namespace, s.cfg.Job, err)
		}
	}
}

// Capacity reports how many workers the cluster holds for the Job now.
// When some Pod of the Job is Pending with the condition PodScheduled=False
// and reason Unschedulable, the cluster has no room for it: the capacity
// is then the Job's active Pods that are scheduled (ok true), so the
// policy trains at the size that runs rather than waiting or asking for
// more. When no Pod is unschedulable the cluster states no bound (ok
// false): the job's MaxWorkers bounds it alone. A Pod that later
// schedules raises the capacity again.
func (s *Scaler) Capacity(ctx context.Context) (int, bool, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelJobName: s.cfg.Job}).String()
	pods, err := s.client.CoreV1().Pods(s.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return 0, false, fmt.Errorf("jobscale: listing the Pods of Job %s/%s: %w", s.cfg.Namespace, s.cfg.Job, err)
	}
	scheduled, unschedulable := CountPods(pods.Items)
	if unschedulable == 0 {
		return 0, false, nil
	}
	return max(scheduled, 1), true, nil
}

// CountPods counts, among pods, the active ones (neither terminated nor
// being deleted) that are scheduled and those that are Pending with
// PodScheduled=False, reason Unschedulable.
func CountPods(pods []corev1.Pod) (scheduled, unschedulable int) {
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if Unschedulable(p) {
			unschedulable++
		} else if p.Spec.NodeName != "" || p.Status.Phase == corev1.PodRunning {
			scheduled++
		}
	}
	return scheduled, unschedulable
}

// Unschedulable reports whether p is Pending with the condition
// PodScheduled=False and reason Unschedulable (the scheduler found no node
// for it).
func Unschedulable(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse &&
			strings.EqualFold(c.Reason, corev1.PodReasonUnschedulable) {
			return true
		}
	}
	return false
}
