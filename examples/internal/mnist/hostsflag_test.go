package mnist

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/netns"
)

// -hosts HxL and -cap RATE: the example makes the hosts itself (network
// namespaces, internal/netns), so these tests run as root; like the other
// namespace tests they skip elsewhere, except with CI=true, where they
// fail.

// placed returns the network namespace of each worker from the launcher's
// log ("[launcher] worker I runs in network namespace NS").
func placed(log string) map[int]string {
	where := map[int]string{}
	for _, m := range regexp.MustCompile(`\[launcher\] worker (\d+) runs in network namespace (\S+)`).FindAllStringSubmatch(log, -1) {
		i, _ := strconv.Atoi(m[1])
		where[i] = m[2]
	}
	return where
}

// netOf returns the netns ID ("P-S") of a namespace "et-P-S-HOST".
func netOf(t *testing.T, ns string) string {
	t.Helper()
	m := regexp.MustCompile(`^et-([0-9a-z]+-[0-9a-z]+)-h\d+$`).FindStringSubmatch(ns)
	require.NotNil(t, m, "namespace %q is not one of -hosts'", ns)
	return m[1]
}

// leftovers lists the namespaces and links of the Net with ID id that
// still exist.
func leftovers(t *testing.T, id string) []string {
	t.Helper()
	var left []string
	list, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	links, err := exec.Command("ip", "-o", "link", "show").Output()
	require.NoError(t, err)
	for _, f := range strings.Fields(string(list) + " " + string(links)) {
		name, _, _ := strings.Cut(strings.TrimSuffix(f, ":"), "@")
		if name == "et-"+id || strings.HasPrefix(name, "et-"+id+"-") || name == "etb-"+id || strings.HasPrefix(name, "etv-"+id+"-") {
			left = append(left, name)
		}
	}
	return left
}

// -hosts 2x1 -cap 100mbit: one worker on each of two hosts behind capped
// links, the embedded store reached from both through the bridge; the
// job trains every sample exactly once and nothing of the hosts remains.
func TestHostsFlagRunsEachWorkerOnItsOwnCappedHost(t *testing.T) {
	netns.RequireForTest(t)
	// A global batch of 1024: 58 steps, each an allreduce of the MLP's
	// 0.8 MB over 100 Mbit/s links (about 65 ms), so the run takes seconds.
	code, stdout, stderr := runMain(t, "-hosts", "2x1", "-cap", "100mbit", "-epochs", "1", "-batch", "1024", "-json", "-quiet")
	require.Equal(t, 0, code, "stderr:\n%s", stderr)

	where := placed(stderr)
	require.Len(t, where, 2, stderr)
	require.NotEqual(t, where[0], where[1], "the two workers on two hosts")
	require.True(t, strings.HasSuffix(where[0], "-h0") && strings.HasSuffix(where[1], "-h1"), "%v", where)
	id := netOf(t, where[0])
	require.Equal(t, id, netOf(t, where[1]))
	require.Regexp(t, `\[launcher\] 2 hosts x 1 workers on network namespaces in 10\.\d+\.\d+\.0/24, links capped at 100mbit each way \(tc tbf\); the hosts reach the store at 10\.\d+\.\d+\.254:\d+`, stderr)

	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var res result
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), stdout)
	require.Equal(t, 2, res.WorldSizes[0], "the first round holds both hosts' workers: %v", res.WorldSizes)
	require.Equal(t, 2, res.Workers)
	require.Zero(t, res.AuditMissing, "audit: samples never trained")
	require.Zero(t, res.AuditDuplicates, "audit: samples trained twice")
	require.Equal(t, (60000/1024)*1024, res.SamplesApplied, "every sample of whole global batches exactly once")
	require.Equal(t, "2x1", res.Hosts)
	require.Equal(t, "100mbit", res.Cap)
	require.Empty(t, leftovers(t, id), "the hosts are removed at the end")
}

// A Ctrl-C (SIGINT) to the launcher while the workers train on their
// hosts: the workers leave as preempted, and the namespaces, links and
// relay are removed before the launcher exits.
func TestHostsFlagCtrlCRemovesTheHosts(t *testing.T) {
	netns.RequireForTest(t)
	cmd := exec.Command(os.Args[0], "-hosts", "2x1", "-cap", "100mbit", "-epochs", "3", "-batch", "256")
	lines := startMain(t, cmd)
	var log strings.Builder
	training := regexp.MustCompile(`^\[launcher\] epoch \d+ step [1-9]\d*`)
	deadline := time.After(3 * time.Minute) // a guard against a hang, not a bound on speed
	for waiting := true; waiting; {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the launcher ended before training:\n%s", log.String())
			log.WriteString(l + "\n")
			waiting = !training.MatchString(l)
		case <-deadline:
			t.Fatalf("no step trained in 3 minutes:\n%s", log.String())
		}
	}
	where := placed(log.String())
	require.Len(t, where, 2, log.String())
	id := netOf(t, where[0])
	require.NotEmpty(t, leftovers(t, id), "the hosts exist while the job trains")

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for l := range lines {
		log.WriteString(l + "\n")
	}
	cmd.Wait()
	out := log.String()
	require.Equal(t, 143, cmd.ProcessState.ExitCode(), "preempted:\n%s", out)
	require.Contains(t, out, "mnist: job preempted")
	require.NotContains(t, out, "removing the hosts")
	require.Empty(t, leftovers(t, id), "the hosts are removed on Ctrl-C:\n%s", out)
}

// Bad -hosts and -cap values, and combinations that cannot work, exit
// with status 2 and say why before anything starts.
func TestHostsFlagsBadValuesExitWithStatus2(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"-cap", "100mbit"}, "-cap needs -hosts"},
		{[]string{"-cap", "0"}, "-cap needs -hosts"},
		{[]string{"-hosts", "2"}, `-hosts: netns: layout "2": want HxL`},
		{[]string{"-hosts", "0x1"}, `-hosts: netns: layout "0x1": want HxL`},
		{[]string{"-hosts", "65x1"}, `-hosts: netns: layout "65x1": want HxL`},
		{[]string{"-hosts", "2x1", "-cap", "fast"}, `-cap: netns: rate "fast": want a rate such as 100mbit`},
		{[]string{"-hosts", "2x1", "-cap", "-1mbit"}, `-cap: netns: rate "-1mbit"`},
		{[]string{"-hosts", "2x1", "-cap", "NaN"}, `-cap: netns: rate "NaN"`},
		{[]string{"-hosts", "4x1", "-max", "3"}, "-hosts 4x1 starts 4 workers, above -max 3"},
		{[]string{"-hosts", "2x1", "-worker", "-job", "j", "-redis", "a:1"}, "-hosts belongs to the launcher"},
		{[]string{"-hosts", "2x1", "-redis", "a:1,b:2", "-redis-master", "m"}, "-hosts with -redis-master"},
		{[]string{"-hosts", "2x1", "-redis", "a:1", "-redis-tls"}, "-hosts with -redis-tls or -redis-ca"},
		{[]string{"-hosts", "2x1", "-listen", "127.0.0.1:0"}, `-listen "127.0.0.1:0" with -hosts: want 0.0.0.0:PORT`},
		{[]string{"-hosts", "2x2", "-listen", "0.0.0.0:29500"}, "2 workers on a host cannot share port 29500"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runMain(t, tc.args...)
			require.Equal(t, 2, code, "stderr: %s", stderr)
			require.Contains(t, stderr, tc.want)
			require.Empty(t, stdout)
		})
	}
}

// Without the privilege to make namespaces, -hosts exits with status 2
// and says what it needs, before anything starts. As root the command
// runs as user nobody (a copy of the test binary it can execute).
func TestHostsFlagWithoutRootExitsWithStatus2(t *testing.T) {
	if os.Geteuid() != 0 {
		code, stdout, stderr := runMain(t, "-hosts", "2x1")
		require.Equal(t, 2, code, "stderr: %s", stderr)
		require.Contains(t, stderr, "-hosts: netns: network namespaces unavailable")
		require.Empty(t, stdout)
		return
	}
	dir, err := os.MkdirTemp("", "mnist-hosts-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "mnist.test")
	data, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	cmd := exec.Command(bin, "-hosts", "2x1", "-cap", "100mbit")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), envAsMain+"=1", "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Run()
	require.Equal(t, 2, cmd.ProcessState.ExitCode(), "stderr: %s", stderr.String())
	require.Contains(t, stderr.String(), "-hosts: netns: network namespaces unavailable")
	require.Contains(t, stderr.String(), "needs root or CAP_NET_ADMIN")
	require.Empty(t, stdout.String())
	require.NotContains(t, stderr.String(), "[launcher]", "nothing started")
}
