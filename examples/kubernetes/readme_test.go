package kubernetes_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
)

// guideSection returns the section of the guide at path (relative to the
// repository's root) headed "## title" (or "### title"), up to the next
// heading.
func guideSection(t *testing.T, path, title string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	require.NoError(t, err)
	s := string(b)
	loc := regexp.MustCompile(`\n##+ ` + regexp.QuoteMeta(title) + `\n`).FindStringIndex(s)
	require.NotNil(t, loc, "%s has no %q section", path, title)
	s = s[loc[0]+1:]
	if j := regexp.MustCompile(`\n##+ `).FindStringIndex(s[4:]); j != nil {
		s = s[:j[0]+4]
	}
	return s
}

// The Kubernetes guide (docs/operations.md) says what the manifests do: its commands
// apply every manifest but the placeholder secret, create the secret the
// Job reads, build the image the Dockerfile describes, select the Job's
// pods and patch the Job by name; its table has a row per file.
func TestGuideMatchesTheManifests(t *testing.T) {
	guide := guideSection(t, "docs/operations.md", "Kubernetes")
	m := loadManifests(t, "manifests")
	v := workerJob(t, m)
	files, err := filepath.Glob("manifests/*.yaml")
	require.NoError(t, err)
	apply := regexp.MustCompile(`(?s)kubectl apply (.*?)\n\S`).FindStringSubmatch(strings.ReplaceAll(guide, "\\\n", " "))
	require.NotNil(t, apply, "no kubectl apply command")
	for _, f := range files {
		name := filepath.Base(f)
		require.Contains(t, guide, "| `"+name+"` |", "the table has no row for %s", name)
		if name == "secret.yaml" {
			require.NotContains(t, apply[1], name, "the placeholder secret is not applied")
			continue
		}
		require.Contains(t, apply[1], "-f examples/kubernetes/manifests/"+name, "the apply command misses %s", name)
	}

	sec := envVar(t, v.container, jobenv.EnvSecret).ValueFrom.SecretKeyRef
	create := regexp.MustCompile(`kubectl create secret generic \S+ [^\n]*`).FindString(strings.ReplaceAll(guide, "\\\n", " "))
	require.Contains(t, create, "kubectl create secret generic "+sec.Name+" --from-literal="+sec.Key+"=")
	// The same command creates the bucket's access key, in the Secret the
	// Job reads it from.
	for _, name := range []string{envS3KeyID, envS3SecretKey} {
		ref := envVar(t, v.container, name).ValueFrom.SecretKeyRef
		require.Equal(t, sec.Name, ref.Name)
		require.Contains(t, create, " --from-literal="+ref.Key+"=")
	}

	df, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	build := regexp.MustCompile(`docker build -f examples/kubernetes/Dockerfile -t REGISTRY/elastictrain-mnist:TAG \.`)
	require.Regexp(t, build, string(df), "the Dockerfile's header says how to build it")
	require.Regexp(t, build, guide)

	logs := regexp.MustCompile("kubectl logs -f -l (\\S+)").FindStringSubmatch(guide)
	require.NotNil(t, logs)
	sel, err := labels.Parse(logs[1])
	require.NoError(t, err)
	require.True(t, sel.Matches(labels.Set(v.job.Spec.Template.Labels)), "the logs command selects the Job's pods")

	require.Contains(t, guide, "kubectl patch job "+v.job.Name+" ")
	require.Contains(t, guide, "`-min "+v.flags["min"]+"` and `-max "+v.flags["max"]+"`")
	tgps := strconv.Itoa(int(*v.job.Spec.Template.Spec.TerminationGracePeriodSeconds))
	require.Contains(t, guide, "`terminationGracePeriodSeconds` "+tgps+" above `-grace "+v.flags["grace"]+"`")
	require.Contains(t, guide, "`parallelism` "+strconv.Itoa(int(*v.job.Spec.Parallelism))+" between")
	require.Contains(t, guide, "`-max "+v.flags["max"]+"` (= `completions`)")
	require.Equal(t, v.flags["max"], strconv.Itoa(int(*v.job.Spec.Completions)))
	require.Contains(t, guide, "exits with status 143")
	mem := v.container.Resources.Limits[corev1.ResourceMemory]
	require.Contains(t, guide, "a "+strings.TrimSuffix(mem.String(), "Gi")+" GiB memory limit")
}
