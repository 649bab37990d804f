package kubernetes_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/trainer"
)

// kinds maps each apiVersion/kind the manifests may hold to a new value of
// its Kubernetes API type.
var kinds = map[string]func() any{
	"batch/v1/Job":                             func() any { return &batchv1.Job{} },
	"v1/Service":                               func() any { return &corev1.Service{} },
	"v1/Secret":                                func() any { return &corev1.Secret{} },
	"v1/PersistentVolumeClaim":                 func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/Deployment":                       func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":            func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":       func() any { return &networkingv1.NetworkPolicy{} },
	"v1/ServiceAccount":                        func() any { return &corev1.ServiceAccount{} },
	"rbac.authorization.k8s.io/v1/Role":        func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any { return &rbacv1.RoleBinding{} },
}

// manifests holds every object of manifests/*.yaml by "Kind/name".
type manifests map[string]any

// loadManifests decodes every YAML document of every file in dir strictly:
// an unknown or duplicated field, a value of the wrong type, an unknown
// kind or a kind under the wrong apiVersion is an error.
func loadManifests(t *testing.T, dir string) manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	out := manifests{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, doc := range splitYAML(b) {
			var tm metav1.TypeMeta
			require.NoError(t, yaml.Unmarshal(doc, &tm), "%s document %d", f, i)
			mk, ok := kinds[tm.APIVersion+"/"+tm.Kind]
			require.True(t, ok, "%s document %d: apiVersion %q kind %q is none of the expected types", f, i, tm.APIVersion, tm.Kind)
			obj := mk()
			require.NoError(t, yaml.UnmarshalStrict(doc, obj), "%s document %d (%s) does not decode strictly", f, i, tm.Kind)
			name := objectMeta(obj).Name
			require.NotEmpty(t, name, "%s document %d has no name", f, i)
			key := tm.Kind + "/" + name
			require.NotContains(t, out, key, "%s: %s defined twice", f, key)
			out[key] = obj
		}
	}
	return out
}

// splitYAML cuts a multi-document YAML file at its "---" lines, dropping
// documents that hold only comments or nothing.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		body := false
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				body = true
			}
		}
		if body {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func objectMeta(obj any) metav1.ObjectMeta {
	o, ok := obj.(metav1.ObjectMetaAccessor)
	if !ok {
		panic(fmt.Sprintf("no ObjectMeta for %T", obj))
	}
	return *o.GetObjectMeta().(*metav1.ObjectMeta)
}

func get[T any](t *testing.T, m manifests, key string) T {
	t.Helper()
	obj, ok := m[key]
	require.True(t, ok, "no %s among the manifests", key)
	v, ok := obj.(T)
	require.True(t, ok, "%s is a %T", key, obj)
	return v
}

// flagArgs reads a container's "-name value" arguments (boolean flags,
// given alone, map to "true"). Arguments that are not flags are an error.
func flagArgs(t *testing.T, args []string, boolFlags ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		require.True(t, strings.HasPrefix(a, "-"), "argument %q is not a flag", a)
		name := strings.TrimLeft(a, "-")
		if k, v, ok := strings.Cut(name, "="); ok {
			out[k] = v
			continue
		}
		if slices.Contains(boolFlags, name) {
			out[name] = "true"
			continue
		}
		require.Less(t, i+1, len(args), "flag %s has no value", a)
		out[name] = args[i+1]
		i++
	}
	return out
}

// The values different files must agree on, and the SDK's settings the
// manifests depend on.
type jobView struct {
	job       *batchv1.Job
	container corev1.Container
	flags     map[string]string
}

func workerJob(t *testing.T, m manifests) jobView {
	t.Helper()
	job := get[*batchv1.Job](t, m, "Job/mnist")
	cs := job.Spec.Template.Spec.Containers
	require.Len(t, cs, 1)
	require.Equal(t, "worker", cs[0].Name)
	require.Empty(t, cs[0].Command, "the image's entrypoint is the worker")
	return jobView{job: job, container: cs[0], flags: flagArgs(t, cs[0].Args, "worker")}
}

func intFlag(t *testing.T, v jobView, name string) int {
	t.Helper()
	n, err := strconv.Atoi(v.flags[name])
	require.NoError(t, err, "-%s %q", name, v.flags[name])
	return n
}

func port(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return 0
}

func hostPort(t *testing.T, flag, v string) (string, int32) {
	t.Helper()
	h, p, err := net.SplitHostPort(v)
	require.NoError(t, err, "-%s %q", flag, v)
	n, err := strconv.Atoi(p)
	require.NoError(t, err, "-%s %q", flag, v)
	return h, int32(n)
}

func envVar(t *testing.T, c corev1.Container, name string) corev1.EnvVar {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("container %s has no environment variable %s", c.Name, name)
	return corev1.EnvVar{}
}

func TestManifestsDecodeStrictlyAgainstTheKubernetesTypes(t *testing.T) {
	m := loadManifests(t, "manifests")
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	require.Equal(t, []string{
		"Deployment/elastictrain-redis",
		"Job/mnist",
		"NetworkPolicy/elastictrain-redis",
		"NetworkPolicy/mnist-workers",
		"PodDisruptionBudget/mnist",
		"Role/mnist-scaler",
		"RoleBinding/mnist-scaler",
		"Secret/mnist-job",
		"Service/elastictrain-redis",
		"Service/mnist",
		"ServiceAccount/mnist-worker",
	}, keys)

	// The strict decoding is strict: an unknown field is refused.
	bad := []byte("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: x\nspec:\n  parallelizm: 3\n")
	require.ErrorContains(t, yaml.UnmarshalStrict(bad, &batchv1.Job{}), `unknown field "parallelizm"`)
}

func TestTheJobIsAnElasticIndexedJob(t *testing.T) {
	m := loadManifests(t, "manifests")
	v := workerJob(t, m)
	spec := v.job.Spec
	require.Equal(t, "true", v.flags["worker"], "each pod runs one worker, without the local launcher")
	require.NotNil(t, spec.CompletionMode)
	require.Equal(t, batchv1.IndexedCompletion, *spec.CompletionMode)
	require.NotNil(t, spec.Parallelism)
	require.NotNil(t, spec.Completions)
	minW, maxW := intFlag(t, v, "min"), intFlag(t, v, "max")
	require.Equal(t, maxW, int(*spec.Completions), "completions is the most workers the job may have: parallelism moves below it")
	require.GreaterOrEqual(t, int(*spec.Parallelism), minW, "the first round needs -min workers")
	require.LessOrEqual(t, int(*spec.Parallelism), maxW)
	// Fewer indexes than completions run: the first success ends the Job.
	require.NotNil(t, spec.SuccessPolicy)
	require.Len(t, spec.SuccessPolicy.Rules, 1)
	require.NotNil(t, spec.SuccessPolicy.Rules[0].SucceededCount)
	require.EqualValues(t, 1, *spec.SuccessPolicy.Rules[0].SucceededCount)
	require.Nil(t, spec.SuccessPolicy.Rules[0].SucceededIndexes)
	require.Equal(t, corev1.RestartPolicyNever, v.job.Spec.Template.Spec.RestartPolicy, "podFailurePolicy needs restartPolicy Never")

	// The exit codes of the worker the failure policy names are the
	// worker's: 143 after a graceful leave (not a failure), 2 for bad flags.
	require.NotNil(t, spec.PodFailurePolicy)
	ignored, failing, failIndex := map[int32]bool{}, map[int32]bool{}, map[int32]bool{}
	disruption := false
	for _, r := range spec.PodFailurePolicy.Rules {
		if r.OnExitCodes != nil {
			require.Equal(t, "worker", *r.OnExitCodes.ContainerName)
			require.Equal(t, batchv1.PodFailurePolicyOnExitCodesOpIn, r.OnExitCodes.Operator)
			for _, c := range r.OnExitCodes.Values {
				switch r.Action {
				case batchv1.PodFailurePolicyActionIgnore:
					ignored[c] = true
				case batchv1.PodFailurePolicyActionFailJob:
					failing[c] = true
				case batchv1.PodFailurePolicyActionFailIndex:
					failIndex[c] = true
				}
			}
		}
		for _, c := range r.OnPodConditions {
			if c.Type == corev1.DisruptionTarget && r.Action == batchv1.PodFailurePolicyActionIgnore {
				disruption = true
			}
		}
	}
	require.True(t, ignored[exitPreempted], "a worker that left gracefully (exit %d) is not a failure", exitPreempted)
	require.True(t, failing[exitUsage], "bad flags (exit %d) fail the Job at once", exitUsage)
	require.True(t, failIndex[exitPermanent], "a permanent error (exit %d) stops its index only, not the Job", exitPermanent)
	require.True(t, failIndex[exitRefused], "a refused stale pod (exit %d) stops its index only, not the Job", exitRefused)
	require.True(t, failIndex[exitJobFinished], "a worker whose job had finished before it started (exit 4, launch.StatusJobFinished) stops its index only")
	require.True(t, disruption, "evictions (DisruptionTarget) are not failures")

	// The headless Service selects the Job's pods, which name it as their
	// subdomain.
	svc := get[*corev1.Service](t, m, "Service/mnist")
	require.Equal(t, corev1.ClusterIPNone, svc.Spec.ClusterIP)
	require.Equal(t, svc.Name, v.job.Spec.Template.Spec.Subdomain)
	require.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(v.job.Spec.Template.Labels)))

	// The PodDisruptionBudget keeps -min workers through voluntary
	// disruptions, over the same pods.
	pdb := get[*policyv1.PodDisruptionBudget](t, m, "PodDisruptionBudget/mnist")
	require.NotNil(t, pdb.Spec.MinAvailable)
	require.Equal(t, intstr.Int, pdb.Spec.MinAvailable.Type, "a Job's pods take an integer minAvailable")
	require.Equal(t, minW, pdb.Spec.MinAvailable.IntValue())
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	require.NoError(t, err)
	require.True(t, sel.Matches(labels.Set(v.job.Spec.Template.Labels)))
}

func TestTheJobAgreesWithTheWorkersSettings(t *testing.T) {
	m := loadManifests(t, "manifests")
	v := workerJob(t, m)
	c := v.container
	pod := v.job.Spec.Template.Spec

	// Grace: the kubelet waits longer than the worker may take to leave
	// (-grace, trainer.Config.GracePeriod) plus its telemetry flush.
	grace := trainer.DefaultConfig().GracePeriod
	if g, ok := v.flags["grace"]; ok {
		d, err := time.ParseDuration(g)
		require.NoError(t, err)
		grace = d
	}
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	require.Greater(t, time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, grace+telemetryFlush+5*time.Second,
		"terminationGracePeriodSeconds must exceed the worker's grace period (%v) and its telemetry flush", grace)

	// The peer port: the worker binds and advertises its pod IP there,
	// the container and the headless Service expose it, the network
	// policy lets the job's pods in.
	host, peer := hostPort(t, "listen", v.flags["listen"])
	require.Equal(t, "$(POD_IP)", host, "the worker binds and advertises its own pod IP")
	ip := envVar(t, c, "POD_IP")
	require.NotNil(t, ip.ValueFrom)
	require.NotNil(t, ip.ValueFrom.FieldRef)
	require.Equal(t, "status.podIP", ip.ValueFrom.FieldRef.FieldPath)
	require.Equal(t, peer, port(t, c, "peer"))
	svc := get[*corev1.Service](t, m, "Service/mnist")
	servicePorts := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		servicePorts[p.Name] = p
	}
	require.Equal(t, peer, servicePorts["peer"].Port)
	peerTarget := servicePorts["peer"].TargetPort
	require.Equal(t, "peer", peerTarget.String())

	// The metrics port: -metrics, the container port, the probes and the
	// Service; the probes ask /healthz, which does not depend on training.
	_, metrics := hostPort(t, "metrics", v.flags["metrics"])
	require.Equal(t, metrics, port(t, c, "metrics"))
	require.Equal(t, metrics, servicePorts["metrics"].Port)
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "startup": c.StartupProbe} {
		require.NotNil(t, p, "%s probe", name)
		require.NotNil(t, p.HTTPGet, "%s probe", name)
		require.Equal(t, "/healthz", p.HTTPGet.Path, "%s probe", name)
		require.Equal(t, "metrics", p.HTTPGet.Port.String(), "%s probe", name)
	}
	require.Nil(t, c.ReadinessProbe, "no readiness gate: the Service publishes not-ready pods")
	require.True(t, svc.Spec.PublishNotReadyAddresses)
	require.Equal(t, fmt.Sprint(metrics), v.job.Spec.Template.Annotations["prometheus.io/port"])
	// The liveness probe gives a frozen process a minute, far more than
	// a slow HTTP answer under load.
	lp := c.LivenessProbe
	require.GreaterOrEqual(t, time.Duration(lp.PeriodSeconds*lp.FailureThreshold)*time.Second, time.Minute)

	// The secret: the variable the worker reads, from the Secret's key.
	sec := envVar(t, c, jobenv.EnvSecret)
	require.NotNil(t, sec.ValueFrom)
	require.NotNil(t, sec.ValueFrom.SecretKeyRef, "the secret comes from a Secret, never a literal")
	secret := get[*corev1.Secret](t, m, "Secret/"+sec.ValueFrom.SecretKeyRef.Name)
	require.Contains(t, secret.StringData, sec.ValueFrom.SecretKeyRef.Key)
	require.Equal(t, jobenv.EnvSecret, sec.ValueFrom.SecretKeyRef.Key)
	for _, a := range c.Args {
		require.NotContains(t, a, secret.StringData[jobenv.EnvSecret], "the secret never goes on a command line")
	}

	// Every $(VAR) in the arguments is defined in the container's
	// environment: Kubernetes leaves an undefined reference as it is.
	for _, a := range c.Args {
		for _, ref := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
			envVar(t, c, ref[1])
		}
	}
	mem := envVar(t, c, "GOMEMLIMIT")
	require.NotNil(t, mem.ValueFrom)
	require.NotNil(t, mem.ValueFrom.ResourceFieldRef)
	require.Equal(t, "limits.memory", mem.ValueFrom.ResourceFieldRef.Resource)
	require.Contains(t, c.Resources.Limits, corev1.ResourceMemory, "GOMEMLIMIT follows the memory limit")
	require.Contains(t, c.Resources.Requests, corev1.ResourceCPU)
	require.Contains(t, c.Resources.Requests, corev1.ResourceMemory)

	// Redis: -redis names the Redis Service and its port, which selects
	// the Redis Deployment's pods and their container port; the network
	// policy admits the workers.
	rhost, rport := hostPort(t, "redis", v.flags["redis"])
	rsvc := get[*corev1.Service](t, m, "Service/"+rhost)
	require.Len(t, rsvc.Spec.Ports, 1)
	require.Equal(t, rport, rsvc.Spec.Ports[0].Port)
	dep := get[*appsv1.Deployment](t, m, "Deployment/elastictrain-redis")
	require.True(t, labels.SelectorFromSet(rsvc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)))
	redisTarget := rsvc.Spec.Ports[0].TargetPort
	require.Equal(t, redisTarget.String(), dep.Spec.Template.Spec.Containers[0].Ports[0].Name)
	require.Equal(t, rport, dep.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort)
	requireIngress(t, get[*networkingv1.NetworkPolicy](t, m, "NetworkPolicy/elastictrain-redis"), dep.Spec.Template.Labels, v.job.Spec.Template.Labels, rport)
	requireIngress(t, get[*networkingv1.NetworkPolicy](t, m, "NetworkPolicy/mnist-workers"), v.job.Spec.Template.Labels, v.job.Spec.Template.Labels, peer)

	// Checkpoints: -checkpoint is object storage, not a volume. No
	// PersistentVolumeClaim at all, the Pod's only volume is an emptyDir
	// for /tmp, and the bucket's key comes from the Secret.
	requireObjectStorageCheckpoints(t, m, v)

	// The container runs as the image's user with a read-only root: the
	// worker writes only to its volumes.
	require.NotNil(t, c.SecurityContext)
	require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	require.True(t, *pod.SecurityContext.RunAsNonRoot)
	df := readDockerfile(t)
	require.Equal(t, fmt.Sprintf("%d:%d", *pod.SecurityContext.RunAsUser, *pod.SecurityContext.RunAsGroup), df.user)
	require.Equal(t, df.dataDir, v.flags["data"], "-data names the directory the image ships the MNIST files in")
}

// s3Env are the environment variables of the worker's S3 checkpoint store
// (examples/kubernetes/mnist): the server, and the access key, which is
// secret.
const (
	envS3Endpoint  = "AWS_ENDPOINT_URL"
	envS3KeyID     = "AWS_ACCESS_KEY_ID"
	envS3SecretKey = "AWS_SECRET_ACCESS_KEY"
)

// requireObjectStorageCheckpoints checks that the Job's workers checkpoint
// to S3-compatible object storage and ask for no shared filesystem:
// -checkpoint is s3://BUCKET/PREFIX, the server is a literal URL, the
// access key and secret come from a Secret of the manifests that holds
// them (and never appear in the arguments), no manifest is a
// PersistentVolumeClaim, and the Pod mounts no volume but emptyDirs.
func requireObjectStorageCheckpoints(t *testing.T, m manifests, v jobView) {
	t.Helper()
	c, pod := v.container, v.job.Spec.Template.Spec
	loc := regexp.MustCompile(`^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/([^/].*)$`).FindStringSubmatch(v.flags["checkpoint"])
	require.NotNil(t, loc, "-checkpoint %q: want s3://BUCKET/PREFIX (a bucket name S3 accepts, a prefix for the job's history)", v.flags["checkpoint"])

	ep := envVar(t, c, envS3Endpoint)
	require.Nil(t, ep.ValueFrom, "the server is no secret: a literal URL")
	require.Regexp(t, `^https?://[^/]+$`, ep.Value)

	for _, name := range []string{envS3KeyID, envS3SecretKey} {
		e := envVar(t, c, name)
		require.NotNil(t, e.ValueFrom, "%s", name)
		require.NotNil(t, e.ValueFrom.SecretKeyRef, "%s comes from a Secret, never a literal", name)
		require.Equal(t, name, e.ValueFrom.SecretKeyRef.Key)
		require.Nil(t, e.ValueFrom.SecretKeyRef.Optional, "a missing key keeps the pod from starting")
		secret := get[*corev1.Secret](t, m, "Secret/"+e.ValueFrom.SecretKeyRef.Name)
		require.Contains(t, secret.StringData, name, "the Secret has a placeholder for %s", name)
		for _, a := range c.Args {
			require.NotContains(t, a, secret.StringData[name], "%s never goes on a command line", name)
		}
	}

	for key, obj := range m {
		_, isClaim := obj.(*corev1.PersistentVolumeClaim)
		require.False(t, isClaim, "%s: the workers share no volume", key)
	}
	mounted := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		mounted[vm.Name] = true
	}
	for _, vol := range pod.Volumes {
		require.NotNil(t, vol.EmptyDir, "volume %s: only emptyDirs, nothing shared between pods", vol.Name)
		require.True(t, mounted[vol.Name], "volume %s is mounted", vol.Name)
	}
}

// requireIngress checks that policy selects the pods labelled target and
// admits, on port, pods labelled from.
func requireIngress(t *testing.T, policy *networkingv1.NetworkPolicy, target, from map[string]string, port int32) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&policy.Spec.PodSelector)
	require.NoError(t, err)
	require.True(t, sel.Matches(labels.Set(target)), "%s does not select its pods", policy.Name)
	for _, rule := range policy.Spec.Ingress {
		portOK := false
		for _, p := range rule.Ports {
			portOK = portOK || p.Port.IntValue() == int(port)
		}
		for _, peer := range rule.From {
			if peer.PodSelector == nil {
				continue
			}
			ps, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
			require.NoError(t, err)
			if portOK && ps.Matches(labels.Set(from)) {
				return
			}
		}
	}
	t.Fatalf("%s does not admit %v on port %d", policy.Name, from, port)
}

// telemetryFlush is the mnist worker's bound on its final telemetry
// export after Run returns (examples/mnist telemetryShutdownTimeout).
const telemetryFlush = 5 * time.Second

// Exit statuses of the mnist worker (examples/mnist exitPreempted, and
// jobenv's exit status for bad flags).
const (
	exitPreempted   = 143
	exitUsage       = 2
	exitJobFinished = 4  // launch.StatusJobFinished
	exitPermanent   = 78 // launch.StatusPermanent
	exitRefused     = 79 // launch.StatusRefused
)

// dockerfile is what the tests read from the Dockerfile.
type dockerfile struct {
	lines    []string // instructions, continuation lines joined
	build    string   // the RUN line that runs go build
	buildDir string   // the WORKDIR it runs in
	env      []string // the ENV lines before it, as NAME=VALUE
	user     string
	dataDir  string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	var df dockerfile
	var cur strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		l := strings.TrimSpace(line)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		cur.WriteString(l)
		df.lines = append(df.lines, cur.String())
		cur.Reset()
	}
	workdir := "/"
	for _, l := range df.lines {
		switch {
		case strings.HasPrefix(l, "WORKDIR "):
			workdir = strings.TrimPrefix(l, "WORKDIR ")
		case strings.HasPrefix(l, "ENV ") && df.build == "":
			df.env = append(df.env, strings.TrimPrefix(l, "ENV "))
		case strings.HasPrefix(l, "RUN ") && strings.Contains(l, "go build"):
			df.build, df.buildDir = strings.TrimPrefix(l, "RUN "), workdir
		case strings.HasPrefix(l, "USER "):
			df.user = strings.TrimPrefix(l, "USER ")
		case strings.HasPrefix(l, "COPY --from=build ") && strings.HasSuffix(l, " /data"):
			df.dataDir = "/data"
		}
	}
	return df
}

func TestDockerfileBuildsAStaticWorkerImage(t *testing.T) {
	df := readDockerfile(t)
	var froms []string
	for _, l := range df.lines {
		if strings.HasPrefix(l, "FROM ") {
			froms = append(froms, l)
		}
	}
	require.Len(t, froms, 2, "a build stage and a runtime stage")
	// The build stage's Go is the one go.mod asks for.
	gomod, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	require.NotNil(t, goVersion)
	require.Equal(t, "FROM golang:"+string(goVersion[1])+" AS build", froms[0])
	require.Regexp(t, `^FROM gcr\.io/distroless/static-debian\d+:nonroot$`, froms[1], "a runtime image without libc: the binary must be static")
	require.Contains(t, df.env, "CGO_ENABLED=0")
	// The build uses this module's go.mod alone: the go.work at the root
	// of the context would need every module of the repository.
	require.Contains(t, df.env, "GOWORK=off")
	// The worker is this module's mnist command (examples/mnist's, with
	// S3 checkpoints), built in this module's directory of the context.
	require.Equal(t, "/src/examples/kubernetes", df.buildDir)
	require.Equal(t, "./mnist", shellFields(df.build)[len(shellFields(df.build))-1])
	require.Contains(t, df.build, "-o /out/mnist")
	// Every module the build replaces with a directory of the repository
	// has its go.mod copied before the download, as this module's has.
	gomod, err = os.ReadFile("go.mod")
	require.NoError(t, err)
	dirs := []string{"."}
	for _, r := range regexp.MustCompile(`(?m)=> (\.\S*)$`).FindAllStringSubmatch(string(gomod), -1) {
		dirs = append(dirs, r[1])
	}
	require.Len(t, dirs, 4, "this module, the core, examples and objstore/s3")
	download := slices.Index(df.lines, "RUN go mod download")
	require.Positive(t, download)
	for _, d := range dirs {
		rel := filepath.ToSlash(filepath.Join("examples/kubernetes", d))
		dst := "./"
		if rel != "." {
			dst += rel + "/"
		}
		src := "go.mod"
		if rel != "." {
			src = rel + "/go.mod"
		}
		i := slices.IndexFunc(df.lines, func(l string) bool {
			return strings.HasPrefix(l, "COPY "+src+" ") && strings.HasSuffix(l, " "+dst)
		})
		require.True(t, i >= 0 && i < download, "the Dockerfile copies %s to %s before go mod download", src, dst)
	}
	require.Contains(t, df.lines, "COPY --from=build /out/mnist /mnist")
	require.Equal(t, "/data", df.dataDir)
	require.Regexp(t, `^\d+:\d+$`, df.user, "a numeric non-root user, which runAsNonRoot can check")
	require.NotEqual(t, "0:0", df.user)
	require.Equal(t, `ENTRYPOINT ["/mnist"]`, df.lines[len(df.lines)-1])
}

// buildWorker builds the worker as the Dockerfile does (its go build line,
// in its WORKDIR, with its ENV lines: CGO_ENABLED=0, GOWORK=off) into dir
// and checks that the result is statically linked.
func buildWorker(t *testing.T, dir string) string {
	t.Helper()
	df := readDockerfile(t)
	fields := shellFields(df.build)
	require.Equal(t, []string{"go", "build"}, fields[:2])
	bin := filepath.Join(dir, "mnist")
	var args []string
	for i := 2; i < len(fields); i++ {
		if fields[i] == "-o" {
			args = append(args, "-o", bin)
			i++
			continue
		}
		args = append(args, fields[i])
	}
	args = append([]string{"build"}, args...)
	src, ok := strings.CutPrefix(df.buildDir, "/src")
	require.True(t, ok, "the build runs under /src, the build context: %s", df.buildDir)
	out, err := runIn(t, filepath.Join("../..", src), df.env, "go", args...)
	require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	requireStatic(t, bin)
	return bin
}

// shellFields splits a shell command line at blanks outside double
// quotes and drops the quotes (enough for the Dockerfile's go build line:
// -ldflags="-s -w").
func shellFields(line string) []string {
	var out []string
	var cur strings.Builder
	quoted, started := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, started = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if started {
				out = append(out, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	if started {
		out = append(out, cur.String())
	}
	return out
}

func runIn(t *testing.T, dir string, env []string, name string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := execCommand(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.Bytes(), err
}

// The workers' Role allows what package kubernetes/jobscale calls and
// nothing more (its tests against a real API server, in kubernetes/e2e,
// run the workers with this Role's service account), and the Job's Pods
// run as the bound account.
func TestTheWorkersMaySizeTheirJobAndNothingElse(t *testing.T) {
	m := loadManifests(t, "manifests")
	role := get[*rbacv1.Role](t, m, "Role/mnist-scaler")
	got := map[string][]string{}
	for _, r := range role.Rules {
		require.Empty(t, r.ResourceNames)
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				got[g+"/"+res] = append(got[g+"/"+res], r.Verbs...)
			}
		}
	}
	require.Equal(t, map[string][]string{"batch/jobs": {"get", "patch"}, "/pods": {"list", "delete"}}, got)
	rb := get[*rbacv1.RoleBinding](t, m, "RoleBinding/mnist-scaler")
	require.Equal(t, "Role", rb.RoleRef.Kind)
	require.Equal(t, role.Name, rb.RoleRef.Name)
	require.Len(t, rb.Subjects, 1)
	require.Equal(t, "ServiceAccount", rb.Subjects[0].Kind)
	sa := get[*corev1.ServiceAccount](t, m, "ServiceAccount/"+rb.Subjects[0].Name)
	v := workerJob(t, m)
	require.Equal(t, sa.Name, v.job.Spec.Template.Spec.ServiceAccountName)
	for name, path := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
		"JOB_NAME": "metadata.labels['batch.kubernetes.io/job-name']"} {
		e := envVar(t, v.container, name)
		require.NotNil(t, e.ValueFrom)
		require.NotNil(t, e.ValueFrom.FieldRef)
		require.Equal(t, path, e.ValueFrom.FieldRef.FieldPath)
	}
}
